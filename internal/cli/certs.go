package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/pki"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create a development CA and mutual-TLS certificates",
		Long: `Create a development CA and the certificates of a mesh that uses mutual TLS.

Identities are SPIFFE IDs in the certificates' URI SAN:

  spiffe://<trust-domain>/node/<name>       a node (its agent) may write only
                                            its own node record and endpoints
  spiffe://<trust-domain>/operator/<name>   an operator may do everything
  spiffe://<trust-domain>/server/<host>     a registrar

"aether certs init" creates the CA; "aether certs issue" issues certificates
from it. The CA key sits unencrypted in ca-key.pem: this is for development
and small meshes; a production mesh can issue the same SPIFFE IDs from its
own PKI.`,
		Example: `  aether certs init --trust-domain example.org --out certs
  aether certs issue --dir certs --server localhost
  aether certs issue --dir certs --node node-a`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var trustDomain, out string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development CA",
		Long: `Create a development CA in --out: an ECDSA P-256 CA certificate valid for 10
years (ca.pem), its key (ca-key.pem, mode 0600) and ca.json recording the
trust domain. An existing CA is never overwritten.`,
		Example: `  aether certs init --trust-domain example.org --out certs
  AETHER_TRUST_DOMAIN=example.org aether certs init`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("trust-domain") {
				return errors.New("--trust-domain is required (e.g. --trust-domain example.org); the registrar's --trust-domain must be the same")
			}
			if err := authz.ValidateTrustDomain(trustDomain); err != nil {
				return fmt.Errorf("--trust-domain: %v", err)
			}
			if out == "" {
				return errors.New("--out must not be empty (use . for the current directory)")
			}
			if err := pki.InitCA(out, trustDomain); err != nil {
				var exists *pki.ExistsError
				if errors.As(err, &exists) {
					return fmt.Errorf("--out %s: a CA already exists there (%s); issue certificates from it with \"aether certs issue%s --server HOST\", or remove %s, %s and %s to start over (certificates the old CA issued stop being trusted)",
						out, exists.Path, dirArg(out), pki.CACertFile, pki.CAKeyFile, pki.CAInfoFile)
				}
				return fmt.Errorf("--out %s: %w", out, err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "created a CA for trust domain %q:\n", trustDomain)
			files := [][2]string{
				{filepath.Join(out, pki.CACertFile), "CA certificate: every registrar and client trusts it"},
				{filepath.Join(out, pki.CAKeyFile), "CA key: keep it secret; only \"aether certs issue\" reads it"},
				{filepath.Join(out, pki.CAInfoFile), "the trust domain"},
			}
			width := len(files[1][0]) // ca-key.pem is the longest
			for _, f := range files {
				fmt.Fprintf(w, "  %-*s  %s\n", width, f[0], f[1])
			}
			_, err := fmt.Fprintf(w, "next: aether certs issue%s --server HOST, then --node NAME for each node\n", dirArg(out))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&trustDomain, "trust-domain", "", "SPIFFE trust domain of the mesh, e.g. example.org (required)")
	f.StringVar(&out, "out", ".", "directory to create the CA in")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	var dir, out, node, operator, server string
	var force, noLocalhost bool
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue a node, operator or server certificate",
		Long: `Issue a certificate from the CA in --dir, for exactly one of:

  --node NAME               a node: spiffe://<trust-domain>/node/NAME, client
                            (and server) auth; for the node's agent
  --operator NAME           an operator: spiffe://<trust-domain>/operator/NAME,
                            client auth; for aether list, drain, ...
  --server HOST[,HOST...]   a registrar: DNS names and IP addresses, plus
                            localhost, 127.0.0.1 and ::1 unless --no-localhost;
                            server and client auth (registrars are also etcd
                            clients)

It writes <kind>-<name>.pem and <kind>-<name>-key.pem (mode 0600) into --out
(default: --dir), valid for --validity (at most until the CA expires).
Existing files are replaced only with --force; a running registrar or agent
reloads replaced files without a restart.`,
		Example: `  aether certs issue --dir certs --server registrar-1.example.com,10.0.0.10
  aether certs issue --dir certs --node node-a
  aether certs issue --dir certs --operator alice
  aether certs issue --dir certs --server localhost --force   # renew in place`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fl := cmd.Flags()
			var set []string
			for _, name := range []string{"node", "operator", "server"} {
				if fl.Changed(name) {
					set = append(set, "--"+name)
				}
			}
			switch len(set) {
			case 0:
				return errors.New("give one of --node NAME, --operator NAME or --server HOST[,HOST...]")
			case 1:
			default:
				both := "both"
				if len(set) > 2 {
					both = "all"
				}
				return fmt.Errorf("%s are %s set; give exactly one of --node, --operator or --server (the environment variables AETHER_NODE, AETHER_OPERATOR and AETHER_SERVER set them too)", strings.Join(set, " and "), both)
			}
			var kind pki.Kind
			var name string
			switch set[0] {
			case "--node":
				kind, name = pki.Node, node
			case "--operator":
				kind, name = pki.Operator, operator
			default:
				kind, name = pki.Server, server
			}
			if err := pki.CheckName(kind, name); err != nil {
				return fmt.Errorf("%s: %v", set[0], err)
			}
			if noLocalhost && kind != pki.Server {
				return fmt.Errorf("--no-localhost applies only to --server; drop it with %s", set[0])
			}
			if validity <= 0 {
				return fmt.Errorf("--validity %s: must be positive (e.g. 8760h for a year)", validity)
			}
			if dir == "" {
				return errors.New("--dir must not be empty (use . for the current directory)")
			}
			if !fl.Changed("out") {
				out = dir
			} else if out == "" {
				return errors.New("--out must not be empty (leave it out to write into --dir)")
			}
			if _, err := os.Stat(filepath.Join(dir, pki.CAInfoFile)); errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("--dir %s: no CA there (%s does not exist); create one with \"aether certs init --trust-domain DOMAIN%s\", or point --dir at an existing one",
					dir, filepath.Join(dir, pki.CAInfoFile), outArg(dir))
			}

			opts := []pki.IssueOption{pki.WithOutDir(out), pki.WithValidity(validity)}
			if force {
				opts = append(opts, pki.WithOverwrite())
			}
			if noLocalhost {
				opts = append(opts, pki.WithoutLocalhost())
			}
			iss, err := pki.Issue(dir, kind, name, opts...)
			if err != nil {
				var exists *pki.ExistsError
				if errors.As(err, &exists) {
					return fmt.Errorf("%s already exists; pass --force to replace it (a running registrar or agent reloads the new files), or remove it", exists.Path)
				}
				return fmt.Errorf("--dir %s: %w", dir, err)
			}
			return printIssued(cmd.OutOrStdout(), iss)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".", "directory of the CA (as created by aether certs init --out)")
	f.StringVar(&out, "out", "", "directory to write the certificate and key into (default: --dir)")
	f.StringVar(&node, "node", "", "issue a node certificate for this node name")
	f.StringVar(&operator, "operator", "", "issue an operator certificate for this name")
	f.StringVar(&server, "server", "", "issue a registrar certificate for these hosts (DNS names or IPs, comma-separated)")
	f.BoolVar(&force, "force", false, "replace existing certificate and key files")
	f.BoolVar(&noLocalhost, "no-localhost", false, "with --server: leave localhost, 127.0.0.1 and ::1 out")
	f.DurationVar(&validity, "validity", pki.DefaultValidity, "how long the certificate is valid")
	return cmd
}

// printIssued reports the files written and how to use them.
func printIssued(w io.Writer, iss *pki.Issued) error {
	fmt.Fprintf(w, "issued %s certificate %s, valid until %s:\n", iss.Kind, iss.URI, iss.NotAfter.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "  %s\n  %s\n", iss.CertFile, iss.KeyFile)
	if iss.Kind == pki.Server {
		var ips []string
		for _, ip := range iss.IPs {
			ips = append(ips, ip.String())
		}
		fmt.Fprintf(w, "  for DNS names [%s] and IPs [%s]\n", strings.Join(iss.DNSNames, " "), strings.Join(ips, " "))
	}
	ca, cert, key := shellQuote(iss.CAFile), shellQuote(iss.CertFile), shellQuote(iss.KeyFile)
	var err error
	switch iss.Kind {
	case pki.Server:
		_, err = fmt.Fprintf(w, "use: aether registrar --trust-domain %s --tls-cert %s --tls-key %s --tls-client-ca %s\n", iss.TrustDomain, cert, key, ca)
	case pki.Node:
		_, err = fmt.Fprintf(w, "use: aether agent --node %s --cacert %s --cert %s --key %s\n", iss.Name, ca, cert, key)
	default:
		_, err = fmt.Fprintf(w, "use: export AETHER_CACERT=%s AETHER_CERT=%s AETHER_KEY=%s  # then aether list, drain, ...\n", ca, cert, key)
	}
	return err
}

// dirArg is " --dir DIR" for hints, or "" for the default ".".
func dirArg(dir string) string {
	if filepath.Clean(dir) == "." {
		return ""
	}
	return " --dir " + shellQuote(dir)
}

// outArg is " --out DIR" for hints, or "" for the default ".".
func outArg(dir string) string {
	if filepath.Clean(dir) == "." {
		return ""
	}
	return " --out " + shellQuote(dir)
}

// shellQuote quotes s for a POSIX shell if it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_./:=,@+-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
