package deploy_test

import (
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/aethermesh/aether/internal/cli"
)

// envFlag maps AETHER_GRPC_ADDR to grpc-addr: the inverse of the CLI's
// rule (cli.EnvPrefix + the flag upper-cased, '-' as '_').
func envFlag(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, cli.EnvPrefix)
	if !ok {
		return "", false
	}
	return strings.ToLower(strings.ReplaceAll(rest, "_", "-")), true
}

// otherEnv are the variables the containers may set that are not flags
// (POD_IP: for $(POD_IP) in AETHER_PEER_ADVERTISE_ADDR).
var otherEnv = map[string]bool{"GOMEMLIMIT": true, "POD_IP": true}

// checkContainerCLI parses a container's command line and environment with
// the aether CLI's own flag parser, as the binary will: the subcommand
// exists, every argument is a flag of it with a value it accepts, nothing
// is left over, and every AETHER_ variable names one of its flags (a
// literal value must parse too). It returns the subcommand and every
// problem.
func checkContainerCLI(p *parts, c *corev1.Container) (string, []string) {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if len(c.Command) > 0 && (len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/aether") {
		bad("container %s: command %q overrides the image's ENTRYPOINT", c.Name, c.Command)
	}
	if len(c.Args) == 0 {
		bad("container %s: no args: want an aether subcommand", c.Name)
		return "", probs
	}
	root := cli.NewRoot(io.Discard, io.Discard)
	sub, rest, err := root.Find(c.Args[:1])
	if err != nil || sub == root || len(rest) != 0 {
		bad("container %s: %q is not an aether subcommand (%v)", c.Name, c.Args[0], err)
		return "", probs
	}
	if err := sub.ParseFlags(c.Args[1:]); err != nil {
		bad("container %s: aether %s %s: %v", c.Name, c.Args[0], strings.Join(c.Args[1:], " "), err)
	} else if left := sub.Flags().Args(); len(left) > 0 {
		bad("container %s: aether %s takes no arguments, left over: %q", c.Name, c.Args[0], left)
	}
	env, err := p.env(c)
	if err != nil {
		bad("%v", err)
		return sub.Name(), probs
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := env[k]
		flag, ok := envFlag(k)
		if !ok {
			if !otherEnv[k] {
				bad("container %s: variable %s (%s) is neither AETHER_<FLAG> nor an expected runtime variable", c.Name, k, v.src)
			}
			continue
		}
		f := sub.Flags().Lookup(flag)
		if f == nil {
			bad("container %s: %s (%s) sets --%s, which aether %s does not have", c.Name, k, v.src, flag, sub.Name())
			continue
		}
		if v.from == nil && v.value != "" {
			if err := f.Value.Set(v.value); err != nil {
				bad("container %s: %s=%q (%s): --%s refuses it: %v", c.Name, k, v.value, v.src, flag, err)
			}
		}
	}
	return sub.Name(), probs
}

// Every flag and AETHER_ variable the manifests give the registrar and the
// agent is one the binary has, with a value it accepts.
func TestManifestFlagsExist(t *testing.T) {
	for _, r := range everything(t) {
		p := typedParts(t, r)
		for _, w := range p.workloads() {
			for i := range w.pod.Spec.Containers {
				c := &w.pod.Spec.Containers[i]
				if _, probs := checkContainerCLI(p, c); len(probs) > 0 {
					t.Errorf("%s: %s %s:\n  %s", r.dir, w.kind, w.name, strings.Join(probs, "\n  "))
				}
			}
		}
	}
}

// The check refuses what the binary would refuse.
func TestManifestFlagCheckCatchesBadFlags(t *testing.T) {
	p := typedParts(t, render(t, "overlays/etcd"))
	base := p.deployments[0].Spec.Template.Spec.Containers[0]
	cases := []struct {
		name string
		edit func(c *corev1.Container, p *parts)
		want string
	}{
		{"misspelt flag", func(c *corev1.Container, _ *parts) { c.Args = append(c.Args, "--grpc-adr=:9443") }, "unknown flag: --grpc-adr"},
		{"agent flag on registrar", func(c *corev1.Container, _ *parts) { c.Args = append(c.Args, "--node=n1") }, "unknown flag: --node"},
		{"bad duration", func(c *corev1.Container, _ *parts) { c.Args = append(c.Args, "--node-ttl=soon") }, "invalid argument"},
		{"positional", func(c *corev1.Container, _ *parts) { c.Args = append(c.Args, "extra") }, "left over"},
		{"no subcommand", func(c *corev1.Container, _ *parts) { c.Args = []string{"registrr"} }, "not an aether subcommand"},
		{"env of no flag", func(c *corev1.Container, _ *parts) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "AETHER_REGISTRY_BACKEND", Value: "etcd"})
		}, "does not have"},
		{"env value refused", func(c *corev1.Container, _ *parts) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "AETHER_WRITE_BATCH_INTERVAL", Value: "100"})
		}, "refuses it"},
		{"configmap key of no flag", func(c *corev1.Container, p *parts) {
			cm := p.configMap(c.EnvFrom[0].ConfigMapRef.Name)
			cm.Data["AETHER_CLUSTER"] = "c1" // the agent's flag, not the registrar's
		}, "AETHER_CLUSTER"},
		{"stray variable", func(c *corev1.Container, _ *parts) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "ETCD_ENDPOINTS", Value: "x"})
		}, "neither"},
	}
	if _, probs := checkContainerCLI(p, &base); len(probs) > 0 {
		t.Fatalf("the unbroken container already fails: %v", probs)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := typedParts(t, render(t, "overlays/etcd"))
			ct := p.deployments[0].Spec.Template.Spec.Containers[0].DeepCopy()
			c.edit(ct, p)
			_, probs := checkContainerCLI(p, ct)
			for _, pr := range probs {
				if strings.Contains(pr, c.want) {
					return
				}
			}
			t.Fatalf("want a problem containing %q, got %q", c.want, probs)
		})
	}
}

// The binary the Dockerfile builds, asked for its help, lists every flag
// the manifests pass (the in-process parse above is the same code; this
// is the artifact the image ships).
func TestManifestFlagsInBinaryHelp(t *testing.T) {
	bin := buildLikeDockerfile(t)
	help := map[string]string{}
	flagRE := regexp.MustCompile(`^--([a-z0-9-]+)`)
	for _, r := range everything(t) {
		p := typedParts(t, r)
		for _, w := range p.workloads() {
			for _, c := range w.pod.Spec.Containers {
				sub := c.Args[0]
				if _, ok := help[sub]; !ok {
					out, err := exec.Command(bin, sub, "--help").CombinedOutput()
					if err != nil {
						t.Fatalf("aether %s --help: %v\n%s", sub, err, out)
					}
					help[sub] = string(out)
				}
				env, err := p.env(&c)
				if err != nil {
					t.Fatal(err)
				}
				var flags []string
				for _, a := range c.Args[1:] {
					if m := flagRE.FindStringSubmatch(a); m != nil {
						flags = append(flags, m[1])
					}
				}
				for k := range env {
					if f, ok := envFlag(k); ok {
						flags = append(flags, f)
					}
				}
				for _, f := range flags {
					if !regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(f) + `\b`).MatchString(help[sub]) {
						t.Errorf("%s: %s %s passes --%s, which `aether %s --help` of the Dockerfile's build does not list", r.dir, w.kind, w.name, f, sub)
					}
				}
			}
		}
	}
}
