package difftest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// frame is one gRPC message, unparsed: the proxy forwards bytes.
type frame struct{ b []byte }

// rawCodec passes frames through as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*frame).b, nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	v.(*frame).b = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// alterFunc may rewrite a response message of method (e.g.
// "/etcdserverpb.KV/Range"); it returns the bytes to forward.
type alterFunc func(t testing.TB, method string, msg []byte) []byte

// startProxy is a transparent gRPC proxy to the etcd at backend (host:port)
// that passes every call of every service through, rewriting responses with
// alter: a broken peer made of a real etcd, for proving the checker. It
// stops when the test ends, its goroutines joined.
func startProxy(t *testing.T, backend string, alter alterFunc) string {
	t.Helper()
	cc, err := grpc.NewClient(backend, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("proxy: dial %s: %v", backend, err)
	}
	handler := func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = metadata.NewOutgoingContext(ctx, md)
		cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		// Requests upstream on their own goroutine; responses back here.
		up := make(chan error, 1)
		go func() {
			for {
				var f frame
				if err := ss.RecvMsg(&f); err != nil {
					if errors.Is(err, io.EOF) {
						up <- cs.CloseSend()
					} else {
						up <- err
					}
					return
				}
				if err := cs.SendMsg(&f); err != nil {
					up <- err
					return
				}
			}
		}()
		var downErr error
		for {
			var f frame
			if err := cs.RecvMsg(&f); err != nil {
				if !errors.Is(err, io.EOF) {
					downErr = err
				}
				break
			}
			f.b = alter(t, method, f.b)
			if err := ss.SendMsg(&f); err != nil {
				downErr = err
				break
			}
		}
		cancel()
		<-up
		return downErr
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(handler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: listen: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
		_ = cc.Close()
	})
	return lis.Addr().String()
}
