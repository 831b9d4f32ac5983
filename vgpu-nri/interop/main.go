// Interop check (manual, needs Go and the module proxy; not part of `cargo test`): upstream's runtime
// adaptation, the code containerd embeds (containerd/nri v0.12.1 pkg/adaptation), listening on the socket
// given as the first argument. It synchronizes one pod and container, then calls CreateContainer (with a
// 20 kB annotation, so its request spans several frames) until a plugin answers with env, prints the
// adjustment as JSON, calls RemoveContainer and stops. See run.sh.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
)

func main() {
	sock := os.Args[1]
	ctx := context.Background()
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		pods := []*nri.PodSandbox{{Id: "sb0", Uid: "uid-0", Name: "old", Namespace: "ns"}}
		ctrs := []*nri.Container{{Id: "c0", PodSandboxId: "sb0", Name: "main", Env: []string{"A=1"}}}
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	updateFn := func(ctx context.Context, u []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	r, err := nri.New("containerd", "v2.1.4", syncFn, updateFn, nri.WithSocketPath(sock),
		nri.WithPluginPath("/nonexistent-nri-plugins"), nri.WithPluginConfigPath("/nonexistent-nri-conf"))
	if err != nil {
		panic(err)
	}
	if err := r.Start(); err != nil {
		panic(err)
	}
	fmt.Println("LISTENING")
	pod := &nri.PodSandbox{Id: "sb1", Uid: "uid-a", Name: "trainer", Namespace: "ns"}
	ctr := &nri.Container{Id: "c1", PodSandboxId: "sb1", Name: "main", Env: []string{"MANAGER_VGPU_CLAIM_UID=u1"}}
	big := strings.Repeat("x", 20000)
	ctr.Annotations = map[string]string{"big": big}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		rpl, err := r.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: pod, Container: ctr})
		if err != nil {
			fmt.Println("CREATE-ERROR", err)
		} else if rpl != nil && rpl.Adjust != nil && len(rpl.Adjust.Env) > 0 {
			out, _ := json.Marshal(rpl.Adjust)
			fmt.Println("ADJUST", string(out))
			if err := r.RemoveContainer(ctx, &nri.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
				fmt.Println("REMOVE-ERROR", err)
			} else {
				fmt.Println("REMOVED")
			}
			r.Stop()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Println("TIMEOUT")
	os.Exit(1)
}
