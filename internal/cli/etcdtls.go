package cli

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/aethermesh/aether/pki"
)

// etcdTLSFlags are the TLS flags of a command that talks to etcd directly
// (migrate, cluster check). They are named as the registrar's
// (--etcd-cacert, --etcd-cert, --etcd-key, so AETHER_ETCD_CACERT, ...),
// not --cacert/--cert/--key: those, and AETHER_CACERT/AETHER_CERT/
// AETHER_KEY, are the registrar client's, and an environment set up for
// "aether list" would otherwise hand etcd a registrar client certificate.
type etcdTLSFlags struct {
	caFile, certFile, keyFile string
}

func (e *etcdTLSFlags) add(f *pflag.FlagSet) {
	f.StringVar(&e.caFile, "etcd-cacert", "", "CA bundle (PEM) to verify etcd's server certificate (https:// --etcd-endpoints)")
	f.StringVar(&e.certFile, "etcd-cert", "", "client certificate (PEM) for an etcd that requires one")
	f.StringVar(&e.keyFile, "etcd-key", "", "private key of --etcd-cert (PEM)")
}

// config returns the etcd client TLS config, nil without TLS flags. TLS
// flags with a plaintext endpoint are an error: etcd would be dialled in
// plaintext, and the certificates silently ignored.
func (e *etcdTLSFlags) config(endpoints []string) (*tls.Config, error) {
	if e.caFile == "" && e.certFile == "" && e.keyFile == "" {
		return nil, nil
	}
	if (e.certFile == "") != (e.keyFile == "") {
		return nil, fmt.Errorf("--etcd-cert and --etcd-key go together: give the etcd client certificate and its key, or neither")
	}
	for _, ep := range endpoints {
		if ep = strings.TrimSpace(ep); strings.HasPrefix(ep, "http://") {
			return nil, fmt.Errorf("--etcd-endpoints %s is plaintext but etcd TLS is configured (--etcd-cacert/--etcd-cert/--etcd-key); use https://%s", ep, strings.TrimPrefix(ep, "http://"))
		}
	}
	cfg, err := pki.ClientTLSConfig(e.caFile, e.certFile, e.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--etcd-cacert/--etcd-cert/--etcd-key: %w", err)
	}
	return cfg, nil
}
