package authz

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Endpoint write operations, for AuthorizeEndpointWrite.
const (
	OpRegister   = "register"
	OpUnregister = "unregister"
	OpDrain      = "drain"
)

// Node record write operations, for AuthorizeNodeWrite.
const (
	OpAnnounce  = "announce"
	OpHeartbeat = "heartbeat"
	OpLeave     = "leave"
)

// Rules name what a refusal broke. They are stable and short, for use as a
// metric label.
const (
	// RuleAuthenticated: the call needs an authenticated identity.
	RuleAuthenticated = "authenticated"
	// RuleOwnNodeEndpoints: a node writes only endpoints whose node is its
	// own.
	RuleOwnNodeEndpoints = "own-node-endpoints"
	// RuleOwnNodeRecord: a node announces, heartbeats and leaves only as
	// itself.
	RuleOwnNodeRecord = "own-node-record"
	// RuleReadOnly: the identity (a registrar's server certificate) may
	// read but not write.
	RuleReadOnly = "read-only"
	// RuleKnownOperation: the registrar asked about an operation this
	// package does not know (a bug in the caller; fails closed).
	RuleKnownOperation = "known-operation"
)

// Error is a refusal. Its GRPCStatus makes status.Code and status.Convert
// see the right code, so a gRPC handler can return it as is.
type Error struct {
	// Code is codes.Unauthenticated, codes.PermissionDenied or, for a bad
	// operation name, codes.Internal.
	Code codes.Code
	// Rule is one of the Rule constants.
	Rule string
	// Identity is who was refused (the zero Identity when unauthenticated).
	Identity Identity
	// Op is the refused operation ("" for authentication failures).
	Op string
	// Msg names the identity and the rule.
	Msg string
}

// Error returns the message.
func (e *Error) Error() string { return e.Msg }

// GRPCStatus returns the status a gRPC server should answer with.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Msg) }

// Policy is the write-authorization policy of the registrar:
//
//   - An operator may do everything.
//   - A node may register, unregister and drain only endpoints whose node
//     is its own, and announce, heartbeat and leave only its own node
//     record.
//   - A registrar (server identity) may read but not write.
//   - Any authenticated identity may list and watch.
//   - The zero Identity (no certificate) may do nothing: UNAUTHENTICATED.
//
// The zero Policy is ready to use. Methods return nil or an *Error.
type Policy struct{}

var endpointOps = map[string]string{
	OpRegister:   "register endpoints",
	OpUnregister: "unregister endpoints",
	OpDrain:      "drain endpoints",
}

var nodeOps = map[string]string{
	OpAnnounce:  "announce",
	OpHeartbeat: "heartbeat",
	OpLeave:     "leave",
}

// AuthorizeEndpointWrite decides whether id may perform op (OpRegister,
// OpUnregister or OpDrain) on an endpoint whose node is endpointNode.
//
// The contract that makes this safe: endpointNode must be the node of the
// endpoint AS STORED by the registrar, never a node named by the request.
//
//   - unregister, drain: the registrar looks the endpoint up by its key and
//     passes the stored endpoint's node. (A request does not even carry a
//     node; an endpoint the registrar does not know is NOT_FOUND, which the
//     registrar may answer before or after authorizing.)
//   - register: the registrar calls this for the node of the endpoint in
//     the request and, if the key already holds an endpoint, again for the
//     stored endpoint's node. Otherwise a node could take over another
//     node's endpoint by re-registering its key under its own name.
//
// An endpoint with no node ("") belongs to no node: only operators may
// write it, and a node may not register one (it must set its own node).
func (Policy) AuthorizeEndpointWrite(id Identity, op, endpointNode string) error {
	what, ok := endpointOps[op]
	if !ok {
		return unknownOp(id, op, "endpoint")
	}
	switch id.Kind {
	case Operator:
		return nil
	case Node:
		if endpointNode == id.Name && id.Name != "" { // a nameless node (never parsed, only built by hand) owns nothing
			return nil
		}
		detail := fmt.Sprintf("this endpoint's node is %q", endpointNode)
		if endpointNode == "" {
			detail = "this endpoint has no node"
			if op == OpRegister {
				detail += fmt.Sprintf(" (set its node to %q)", id.Name)
			}
		}
		return &Error{
			Code: codes.PermissionDenied, Rule: RuleOwnNodeEndpoints, Identity: id, Op: op,
			Msg: fmt.Sprintf("%s may only %s of its own node; %s", id, what, detail),
		}
	case Server:
		return readOnly(id, op, what)
	default:
		return unauthenticated(id, op, what)
	}
}

// AuthorizeNodeWrite decides whether id may perform op (OpAnnounce,
// OpHeartbeat or OpLeave) on the node record named node: the node in the
// AnnounceNode request's record, or the node of a Heartbeat or LeaveNode
// request.
func (Policy) AuthorizeNodeWrite(id Identity, op, node string) error {
	what, ok := nodeOps[op]
	if !ok {
		return unknownOp(id, op, "node")
	}
	switch id.Kind {
	case Operator:
		return nil
	case Node:
		if node == id.Name && id.Name != "" {
			return nil
		}
		detail := fmt.Sprintf("this %s is for node %q", op, node)
		if node == "" {
			detail = fmt.Sprintf("this %s names no node", op)
		}
		return &Error{
			Code: codes.PermissionDenied, Rule: RuleOwnNodeRecord, Identity: id, Op: op,
			Msg: fmt.Sprintf("%s may only announce, heartbeat and leave as itself (node %q); %s", id, id.Name, detail),
		}
	case Server:
		return readOnly(id, op, what)
	default:
		return unauthenticated(id, op, what)
	}
}

// AuthorizeRead decides whether id may list and watch: any authenticated
// identity may.
func (Policy) AuthorizeRead(id Identity) error {
	switch id.Kind {
	case Node, Operator, Server:
		return nil
	default:
		return unauthenticated(id, "read", "list or watch")
	}
}

func readOnly(id Identity, op, what string) error {
	return &Error{
		Code: codes.PermissionDenied, Rule: RuleReadOnly, Identity: id, Op: op,
		Msg: fmt.Sprintf("%s may not %s: registrar identities are read-only (only operators, and nodes for their own node, may write)", id, what),
	}
}

func unauthenticated(id Identity, op, what string) error {
	return &Error{
		Code: codes.Unauthenticated, Rule: RuleAuthenticated, Identity: id, Op: op,
		Msg: fmt.Sprintf("%s may not %s: present a client certificate issued by the mesh's CA", id, what),
	}
}

func unknownOp(id Identity, op, kind string) error {
	return &Error{
		Code: codes.Internal, Rule: RuleKnownOperation, Identity: id, Op: op,
		Msg: fmt.Sprintf("authz: unknown %s operation %q (refused)", kind, op),
	}
}
