// Package bootstrap writes the xDS bootstrap file with which a proxyless
// gRPC client (grpc-go's, grpc-java's, ... xds:/// resolver, configured by
// GRPC_XDS_BOOTSTRAP) finds Aether's xDS server: the server's address and
// credentials, and the node it speaks for. The node's locality matters:
// Aether ranks endpoints by it (same zone first, then same region, then the
// rest), so a client that names none is ranked by the server's own.
package bootstrap

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
)

// FieldError is a Config field that cannot work, and why.
type FieldError struct {
	Field  string // "node", "server", "cert", "ca"
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Config is what the bootstrap says.
type Config struct {
	// Server is the xDS server's host:port (an agent's or a registrar's
	// --xds-addr).
	Server string
	// Node is the client's node id: it names the client in the server's
	// logs, metrics and status; the agent's node name is a good choice.
	Node string
	// Region and Zone are the client's locality (optional).
	Region, Zone string
	// CAFile, CertFile and KeyFile make the channel TLS: CAFile verifies
	// the server, CertFile and KeyFile are the client's certificate for
	// mTLS (optional, together). Without CAFile the channel is plaintext,
	// which suits a node-local agent on loopback.
	CAFile, CertFile, KeyFile string
}

// The bootstrap format, as grpc-go reads it (internal/xds/bootstrap); only
// the fields Aether needs.
type file struct {
	XDSServers []server `json:"xds_servers"`
	Node       node     `json:"node"`
}

type server struct {
	ServerURI      string        `json:"server_uri"`
	ChannelCreds   []channelCred `json:"channel_creds"`
	ServerFeatures []string      `json:"server_features"`
}

type channelCred struct {
	Type   string     `json:"type"`
	Config *tlsConfig `json:"config,omitempty"`
}

type tlsConfig struct {
	CACertificateFile string `json:"ca_certificate_file"`
	CertificateFile   string `json:"certificate_file,omitempty"`
	PrivateKeyFile    string `json:"private_key_file,omitempty"`
}

type node struct {
	ID       string    `json:"id"`
	Locality *locality `json:"locality,omitempty"`
}

type locality struct {
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
}

// JSON returns the bootstrap file for c, or an error naming the field that
// cannot work.
func JSON(c Config) ([]byte, error) {
	if c.Node == "" {
		return nil, &FieldError{"node", "a node id is required (it names the client to the server)"}
	}
	host, port, err := net.SplitHostPort(c.Server)
	if err != nil || host == "" {
		return nil, &FieldError{"server", fmt.Sprintf("%q: want host:port of the xDS server (an agent's or registrar's --xds-addr)", c.Server)}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, &FieldError{"server", fmt.Sprintf("%q: the port must be 1-65535", c.Server)}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, &FieldError{"cert", "the client certificate and its key go together: give both, or neither"}
	}
	if c.CertFile != "" && c.CAFile == "" {
		return nil, &FieldError{"ca", "a client certificate needs the CA that verifies the server"}
	}
	cred := channelCred{Type: "insecure"}
	if c.CAFile != "" {
		cred = channelCred{Type: "tls", Config: &tlsConfig{CACertificateFile: c.CAFile, CertificateFile: c.CertFile, PrivateKeyFile: c.KeyFile}}
	}
	f := file{
		XDSServers: []server{{
			ServerURI:    c.Server,
			ChannelCreds: []channelCred{cred},
			// xds_v3: the transport protocol version the server speaks.
			ServerFeatures: []string{"xds_v3"},
		}},
		Node: node{ID: c.Node},
	}
	if c.Region != "" || c.Zone != "" {
		f.Node.Locality = &locality{Region: c.Region, Zone: c.Zone}
	}
	return json.MarshalIndent(f, "", "  ")
}
