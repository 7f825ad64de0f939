package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// jsonOptions is how endpoints and events are rendered as JSON: proto field
// names (stable: they are part of the API), unset fields left out.
var jsonOptions = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false, Multiline: false}

// marshalJSON renders a message as compact single-line JSON. protojson
// output is deliberately not byte-stable, so it is compacted here.
func marshalJSON(m proto.Message) ([]byte, error) {
	raw, err := jsonOptions.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkOutput validates an -o value against the formats a command offers.
func checkOutput(value string, formats ...string) error {
	if slices.Contains(formats, value) {
		return nil
	}
	return fmt.Errorf("-o/--output %q: use %s", value, strings.Join(formats, " or "))
}

// sortedEndpoints returns the endpoints ordered by service, protocol and
// IP (numerically), then origin. The input is not modified.
func sortedEndpoints(eps []*registryv1.ServiceEndpoint) []*registryv1.ServiceEndpoint {
	out := slices.Clone(eps)
	slices.SortStableFunc(out, func(a, b *registryv1.ServiceEndpoint) int {
		if c := strings.Compare(a.GetService(), b.GetService()); c != 0 {
			return c
		}
		if c := strings.Compare(registry.ProtocolName(a.GetProtocol()), registry.ProtocolName(b.GetProtocol())); c != 0 {
			return c
		}
		if c := compareIP(a.GetIp(), b.GetIp()); c != 0 {
			return c
		}
		if c := strings.Compare(a.GetRegion(), b.GetRegion()); c != 0 {
			return c
		}
		return strings.Compare(a.GetCluster(), b.GetCluster())
	})
	return out
}

func compareIP(a, b string) int {
	pa, errA := netip.ParseAddr(a)
	pb, errB := netip.ParseAddr(b)
	if errA == nil && errB == nil {
		return pa.Compare(pb)
	}
	return strings.Compare(a, b)
}

// portsString renders ports as name:port,name:port.
func portsString(ports []*registryv1.Port) string {
	if len(ports) == 0 {
		return "-"
	}
	parts := make([]string, len(ports))
	for i, p := range ports {
		if p.GetName() == "" {
			parts[i] = strconv.FormatUint(uint64(p.GetPort()), 10)
		} else {
			parts[i] = p.GetName() + ":" + strconv.FormatUint(uint64(p.GetPort()), 10)
		}
	}
	return strings.Join(parts, ",")
}

// stateName is SERVING or DRAINING.
func stateName(s registryv1.State) string {
	if s == registryv1.State_STATE_UNSPECIFIED {
		return "-"
	}
	return strings.TrimPrefix(s.String(), "STATE_")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// endpointColumns heads the columns endpointRow fills, for every table of
// endpoints.
const endpointColumns = "SERVICE\tPROTOCOL\tIP\tPORTS\tNODE\tCLUSTER\tREGION\tZONE\tSTATE\tWEIGHT"

// endpointRow is one endpoint as tab-separated table cells.
func endpointRow(ep *registryv1.ServiceEndpoint) string {
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d",
		ep.GetService(),
		registry.ProtocolName(ep.GetProtocol()),
		ep.GetIp(),
		portsString(ep.GetPorts()),
		orDash(ep.GetNode()),
		orDash(ep.GetCluster()),
		orDash(ep.GetRegion()),
		orDash(ep.GetZone()),
		stateName(ep.GetState()),
		ep.GetWeight(),
	)
}

// writeTable prints endpoints as an aligned table, sorted.
func writeTable(w io.Writer, eps []*registryv1.ServiceEndpoint) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, endpointColumns)
	for _, ep := range sortedEndpoints(eps) {
		fmt.Fprintln(tw, endpointRow(ep))
	}
	return tw.Flush()
}

// listJSON is the document "aether list -o json" prints. Its shape and the
// proto field names inside are a stable interface for scripts.
type listJSON struct {
	Version   string            `json:"version"`
	Endpoints []json.RawMessage `json:"endpoints"`
}

// writeListJSON prints a listing as one indented JSON document, endpoints
// sorted like the table. "endpoints" is always present, [] when empty.
func writeListJSON(w io.Writer, version string, eps []*registryv1.ServiceEndpoint) error {
	doc := listJSON{Version: version, Endpoints: []json.RawMessage{}}
	for _, ep := range sortedEndpoints(eps) {
		b, err := marshalJSON(ep)
		if err != nil {
			return fmt.Errorf("encode endpoint %s: %w", registry.IDOf(ep), err)
		}
		doc.Endpoints = append(doc.Endpoints, b)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	_, err = w.Write(out)
	return err
}

// eventJSON renders a watch event as one line of JSON. The type is always
// present, FULL_SNAPSHOT included, although it is the proto default and
// protojson would leave it out.
func eventJSON(ev *registrarv1.EndpointEvent) ([]byte, error) {
	b, err := marshalJSON(ev)
	if err != nil {
		return nil, err
	}
	if ev.GetType() == registrarv1.EndpointEvent_FULL_SNAPSHOT {
		// type is field 1, so protojson would have put it first.
		head := `{"type":"FULL_SNAPSHOT"`
		if len(b) > 2 {
			head += ","
		}
		b = append([]byte(head), b[1:]...)
	}
	return b, nil
}

// eventTypeName is the short name of an event type (ADDED, REMOVED, ...).
func eventTypeName(t registrarv1.EndpointEvent_EventType) string {
	return strings.TrimPrefix(t.String(), "ENDPOINT_")
}

// endpointLine is one endpoint in watch text output:
// web 10.0.0.1 (http) http:8080 SERVING
func endpointLine(ep *registryv1.ServiceEndpoint) string {
	return fmt.Sprintf("%s %s (%s) %s %s", ep.GetService(), ep.GetIp(),
		registry.ProtocolName(ep.GetProtocol()), portsString(ep.GetPorts()), stateName(ep.GetState()))
}
