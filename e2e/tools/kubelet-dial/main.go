// Command kubelet-dial records the bytes a kubelet's plugin watcher writes when it registers a plugin
// over a unix socket: the same dial as k8s.io/kubernetes v1.37.2
// pkg/kubelet/pluginmanager/operationexecutor (grpc.DialContext with the socket path as the target, a
// plain unix dialer, insecure credentials, WithBlock), then GetInfo and NotifyRegistrationStatus on one
// connection. grpc-go sends that path as the HTTP/2 :authority (HPACK, Huffman-coded, indexed for the
// second call), which servers built on the Rust h2 crate refuse.
//
// It answers the calls with an in-process grpc-go server on the socket and writes what the client sent
// (preface, frames) to -out: vgpu-deviceplugin/tests/fixtures/kubelet-plugin-watcher.h2 is its output.
//
//	go run . -out ../../../vgpu-deviceplugin/tests/fixtures/kubelet-plugin-watcher.h2
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// recorder keeps every byte the client writes.
type recorder struct {
	net.Conn
	mu  *sync.Mutex
	buf *[]byte
}

func (r recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	*r.buf = append(*r.buf, p...)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

type registration struct {
	registerapi.UnimplementedRegistrationServer
}

func (registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "DRAPlugin", Name: "manager.nvidia.com", Endpoint: "/var/lib/kubelet/plugins/manager.nvidia.com/dra.sock", SupportedVersions: []string{"v1.DRAPlugin"}}, nil
}

func (registration) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	out := flag.String("out", "kubelet-plugin-watcher.h2", "file the client's bytes are written to")
	// The path is what the kubelet sends as :authority; it need not be under /var/lib/kubelet.
	socket := flag.String("socket", "/tmp/vgpu-kubelet-dial/plugins_registry/manager.nvidia.com-reg.sock", "unix socket to serve and dial")
	flag.Parse()

	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, registration{})
	go func() { _ = server.Serve(lis) }()
	defer server.Stop()

	var mu sync.Mutex
	var written []byte
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//nolint:staticcheck // the kubelet's own (deprecated) call
	conn, err := grpc.DialContext(ctx, *socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "unix", addr)
			if err != nil {
				return nil, err
			}
			return recorder{Conn: c, mu: &mu, buf: &written}, nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		log.Fatal(err)
	}
	// Closing sends nothing the server needs; stop recording before it.
	mu.Lock()
	data := append([]byte(nil), written...)
	mu.Unlock()
	_ = conn.Close()
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("GetInfo answered %q; %d client bytes written to %s", info.Name, len(data), *out)
}
