package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

type registerFlags struct {
	service  string
	ip       string
	ports    []string
	portName string
	protocol string
	node     string
	zone     string
	weight   uint32
	meta     []string
	draining bool
}

func newRegisterCmd() *cobra.Command {
	var rf registerFlags
	var cf *clientFlags
	var wf *waitFlags
	cmd := &cobra.Command{
		Use:   "register",
		Short: "Register or update an endpoint",
		Long: `Register an endpoint of a service with the registrar, or update it.

An endpoint is identified by service, protocol and IP (within the registrar's
cluster and region); registering it again replaces its attributes. Give one
port as --port 8080 (named after the protocol unless --port-name is set), or
several named ports as --port http=8080 --port admin=9000.

The registrar acknowledges a write once it has applied it and told its
watchers, and persists it to its backend shortly after (within its
--write-batch-interval). With --wait the command returns only once the
write is persisted, so a registrar crash right after cannot lose it.`,
		Example: `  aether register --service web --ip 10.0.0.1 --port 8080
  aether register --service api --ip 10.0.0.2 --protocol grpc --port grpc=9090 --port admin=9091 --meta version=1.4.2
  aether register --service web --ip 10.0.0.1 --port 8080 --draining
  aether register --service web --ip 10.0.0.1 --port 8080 --wait`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ep, err := rf.endpoint()
			if err != nil {
				return err
			}
			what := fmt.Sprintf("register %s %s (%s)", ep.Service, ep.Ip, registry.ProtocolName(ep.Protocol))
			if err := wf.validate(); err != nil {
				return err
			}
			var resp *registrarv1.RegisterEndpointResponse
			var warning string
			var callErr error
			ucf := wf.callFlags(cf) // wait.go
			if err := ucf.unary(cmd.Context(), what, func(ctx context.Context, c registrarv1.RegistrarClient) (err error) {
				resp, err = c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep, WaitPersisted: wf.wait})
				callErr = err
				if err == nil && resp.GetEndpoint() != nil {
					warning = nodeWarning(ctx, c, resp.GetEndpoint()) // nodewarn.go
				}
				return err
			}); err != nil {
				if werr := wf.failed(what, callErr); werr != nil {
					return werr
				}
				return err
			}
			if err := wf.confirm(what, ucf.addr, resp.GetPersisted()); err != nil {
				return err
			}
			got := resp.GetEndpoint()
			if got == nil {
				got = ep
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "registered %s %s (%s) version %s%s\n",
				got.GetService(), got.GetIp(), registry.ProtocolName(got.GetProtocol()), resp.GetVersion(), note(resp.GetPersisted()))
			if warning != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), warning)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&rf.service, "service", "", "service name (required)")
	f.StringVar(&rf.ip, "ip", "", "IPv4 or IPv6 address peers dial (required)")
	f.StringSliceVar(&rf.ports, "port", nil, "port, as 8080 or name=8080; repeatable (required)")
	f.StringVar(&rf.portName, "port-name", "", "name of the one unnamed --port (default: the protocol name)")
	f.StringVar(&rf.protocol, "protocol", "http", "protocol: "+registry.ProtocolNames)
	f.StringVar(&rf.node, "node", "", "node (host) the endpoint runs on")
	f.StringVar(&rf.zone, "zone", "", "zone the endpoint runs in")
	f.Uint32Var(&rf.weight, "weight", 0, "relative load-balancing weight (0: the default, 1)")
	f.StringArrayVar(&rf.meta, "meta", nil, "metadata label as key=value; repeatable")
	f.BoolVar(&rf.draining, "draining", false, "register as DRAINING: proxies send no new requests")
	cf = addClientFlags(cmd)
	wf = addWaitFlags(cmd)
	return cmd
}

// endpoint validates the flags locally and builds the endpoint to register.
// The registrar validates again and is the authority; this only turns the
// common mistakes into messages that name the flag.
func (rf *registerFlags) endpoint() (*registryv1.ServiceEndpoint, error) {
	id, err := identityFlags(rf.service, rf.ip, rf.protocol)
	if err != nil {
		return nil, err
	}
	ports, err := parsePorts(rf.ports, rf.portName)
	if err != nil {
		return nil, err
	}
	md, err := parseMeta(rf.meta)
	if err != nil {
		return nil, err
	}
	if rf.node != "" {
		if err := registry.ValidateName("node", rf.node); err != nil {
			return nil, fmt.Errorf("--node: %v", err)
		}
	}
	if rf.zone != "" {
		if err := registry.ValidateName("zone", rf.zone); err != nil {
			return nil, fmt.Errorf("--zone: %v", err)
		}
	}
	state := registryv1.State_STATE_SERVING
	if rf.draining {
		state = registryv1.State_STATE_DRAINING
	}
	return &registryv1.ServiceEndpoint{
		Service:  id.Service,
		Protocol: id.Protocol,
		Ip:       id.IP,
		Ports:    ports,
		Node:     rf.node,
		Zone:     rf.zone,
		State:    state,
		Weight:   rf.weight,
		Metadata: md,
	}, nil
}

// identityFlags validates --service, --ip and --protocol and returns the
// endpoint identity they name (without origin), with the IP canonical.
func identityFlags(service, ip, protocol string) (registry.EndpointID, error) {
	if service == "" {
		return registry.EndpointID{}, errors.New("--service is required")
	}
	if err := registry.ValidateName("service", service); err != nil {
		return registry.EndpointID{}, fmt.Errorf("--service: %v", err)
	}
	if ip == "" {
		return registry.EndpointID{}, errors.New("--ip is required")
	}
	cip, err := registry.CanonicalIP(ip)
	if err != nil {
		return registry.EndpointID{}, fmt.Errorf("--ip: %v", err)
	}
	p, err := registry.ParseProtocol(protocol)
	if err != nil {
		return registry.EndpointID{}, fmt.Errorf("--protocol: %v", err)
	}
	return registry.EndpointID{Service: service, Protocol: p, IP: cip}, nil
}

// parsePorts parses --port values ("8080" or "name=8080") and applies
// --port-name to the one unnamed port.
func parsePorts(specs []string, portName string) ([]*registryv1.Port, error) {
	if len(specs) == 0 {
		return nil, errors.New("--port is required (e.g. --port 8080 or --port http=8080)")
	}
	ports := make([]*registryv1.Port, 0, len(specs))
	var unnamed []int
	for _, spec := range specs {
		name, num, named := strings.Cut(spec, "=")
		if !named {
			name, num = "", spec
		}
		n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--port %s: not a port number (1-65535)", spec)
		}
		if named {
			if err := registry.ValidateName("port name", name); err != nil {
				return nil, fmt.Errorf("--port %s: %v", spec, err)
			}
		} else {
			unnamed = append(unnamed, len(ports))
		}
		ports = append(ports, &registryv1.Port{Name: name, Port: uint32(n)})
	}
	if portName != "" {
		if err := registry.ValidateName("port name", portName); err != nil {
			return nil, fmt.Errorf("--port-name: %v", err)
		}
		switch len(unnamed) {
		case 0:
			return nil, fmt.Errorf("--port-name %s: every --port is already named; drop --port-name or give --port without a name", portName)
		case 1:
			ports[unnamed[0]].Name = portName
		default:
			return nil, fmt.Errorf("--port-name %s: %d ports are unnamed; name each as --port name=NUMBER", portName, len(unnamed))
		}
	} else if len(ports) > 1 && len(unnamed) > 0 {
		spec := specs[unnamed[0]]
		return nil, fmt.Errorf("--port %s: name each port when giving more than one (e.g. --port http=%s)", spec, strings.TrimSpace(spec))
	}
	seen := make(map[string]bool, len(ports))
	numbers := make(map[uint32]int, len(ports))
	for i, p := range ports {
		if j, dup := numbers[p.Port]; dup {
			return nil, fmt.Errorf("--port %s: port number %d is already given by --port %s; each port of an endpoint needs its own number", specs[i], p.Port, specs[j])
		}
		numbers[p.Port] = i
		if p.Name == "" {
			continue
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("--port %s: duplicate port name %q", specs[i], p.Name)
		}
		seen[p.Name] = true
	}
	return ports, nil
}

// parseMeta parses --meta key=value labels.
func parseMeta(specs []string) (map[string]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	md := make(map[string]string, len(specs))
	for _, spec := range specs {
		k, v, ok := strings.Cut(spec, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--meta %q: expected key=value", spec)
		}
		if _, dup := md[k]; dup {
			return nil, fmt.Errorf("--meta %q: key %q is given more than once", spec, k)
		}
		md[k] = v
	}
	return md, nil
}
