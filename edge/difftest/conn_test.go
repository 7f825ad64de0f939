package difftest

import (
	"strconv"
	"testing"

	"google.golang.org/grpc"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// etcdtestConn is a clientv3 connection to one endpoint.
type etcdtestConn struct{ cc grpc.ClientConnInterface }

func connect(t *testing.T, endpoints ...string) *etcdtestConn {
	t.Helper()
	return &etcdtestConn{cc: etcdtest.NewClient(t, endpoints...).ActiveConnection()}
}

func uintStr(v uint64) string { return strconv.FormatUint(v, 10) }
