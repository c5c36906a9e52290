package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// The simulated fleet. Its nodes carry fleetLabel and the taint fleetTaint, so no pod lands on
// them unless it tolerates the taint and selects the label: only pods of runtimeClass do (the
// RuntimeClass admission plugin, on by default, merges the class's scheduling into each pod), and
// the bench's workers give every tenant pod that class (--default-runtime-class). Real pods of
// other suites never schedule to a kwok node; the bench's never to the real one.
const (
	fleetLabel   = "kubeclip.dev/kwok"
	fleetTaint   = "kwok.x-k8s.io/node"
	runtimeClass = "kubeclip-kwok"
	nodePrefix   = "kubeclip-kwok-"
	// podsPerNode is each fake node's pod capacity.
	podsPerNode = 2500
	// podCIDR is where kwok gives the fake pods their IPs: nothing routes to them.
	podCIDR = "10.244.0.0/16"
)

// fleet is kwok's controller, its fake nodes and the RuntimeClass that sends pods to them.
type fleet struct {
	cs    kubernetes.Interface
	cmd   *exec.Cmd
	done  chan error
	nodes []string
}

// startFleet starts kwok (its stages from stages) on kubeconfig's cluster, managing only nodes
// labelled fleetLabel, and creates nodes fake nodes and the RuntimeClass. A kubeletPort other
// than "" is every node's kubelet endpoint on 127.0.0.1 (the bench's logServer): where the API
// server sends a GetLogs of a fleet pod.
func startFleet(ctx context.Context, cs kubernetes.Interface, kwok, stages, kubeconfig, logDir string, nodes int, kubeletPort string) (f *fleet, err error) {
	f = &fleet{cs: cs, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.stop(context.WithoutCancel(ctx)))
			f = nil
		}
	}()
	logFile, err := os.Create(filepath.Join(logDir, "kwok.log"))
	if err != nil {
		return f, err
	}
	// kwok renews each node's Lease (--node-lease-duration-seconds): without it the node
	// lifecycle controller saw no heartbeat for minutes, marked the nodes NotReady and tainted
	// them, and the run-watcher rightly failed the pods left Unschedulable (110 of 3,000).
	// The nodes' InternalIP is loopback, the API server's own host: with --node-port (kwok's
	// node-initialize stage writes it into the node's kubeletEndpoint) the API server reaches the
	// bench's log server there. Given --node-port, kwok starts its own server too, on
	// 0.0.0.0:<node port> unless --server-address says otherwise (and exits if it cannot bind):
	// it gets a port of its own, where nothing calls it.
	args := []string{"--kubeconfig", kubeconfig, "--config", stages,
		"--manage-nodes-with-label-selector", fleetLabel + "=true", "--cidr", podCIDR, "--node-ip", "127.0.0.1",
		"--node-lease-duration-seconds", "40"}
	if kubeletPort != "" {
		own, err := freePort()
		if err != nil {
			logFile.Close()
			return f, err
		}
		args = append(args, "--node-port", kubeletPort, "--server-address", "127.0.0.1:"+own)
	}
	f.cmd = exec.Command(kwok, args...)
	// The API server has no watch-list support (RequestWatchProgress off): without this client-go
	// logs a warning on every watch before falling back to list.
	f.cmd.Env = append(os.Environ(), "KUBE_FEATURE_WatchListClient=false")
	f.cmd.Stdout, f.cmd.Stderr = logFile, logFile
	if err := f.cmd.Start(); err != nil {
		logFile.Close()
		return f, fmt.Errorf("starting kwok: %w", err)
	}
	go func() { f.done <- f.cmd.Wait(); logFile.Close() }()

	rc := &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: runtimeClass, Labels: map[string]string{fleetLabel: "true"}},
		Handler:    "kwok",
		Scheduling: &nodev1.Scheduling{
			NodeSelector: map[string]string{fleetLabel: "true"},
			// The fake nodes' Lease renewals lag when this 2-core machine is busy (load 12): the node
			// lifecycle controller then marks them NotReady for a while and taints them, and the
			// scheduler left 17 of 3,000 pods Unschedulable, which the run-watcher rightly failed.
			// That is the simulation's flapping, not a kubeclip cost: the class tolerates it.
			Tolerations: []corev1.Toleration{
				{Key: fleetTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists},
			},
		},
	}
	if _, err := cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return f, fmt.Errorf("creating RuntimeClass %s: %w", runtimeClass, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("10000"), corev1.ResourceMemory: resource.MustParse("40Ti"),
		corev1.ResourcePods: resource.MustParse(strconv.Itoa(podsPerNode)), corev1.ResourceEphemeralStorage: resource.MustParse("1Pi"),
	}
	for i := range nodes {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: nodePrefix + strconv.Itoa(i), Labels: map[string]string{fleetLabel: "true", "type": "kwok"},
				Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			},
			Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: fleetTaint, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return f, fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		f.nodes = append(f.nodes, n.Name)
	}
	if err := f.waitReady(ctx); err != nil {
		return f, err
	}
	return f, f.checkReinitialized(ctx, kubeletPort)
}

// checkReinitialized has kwok initialize every fake node once more and checks that each keeps
// its InternalIP (and kubeletPort, other than ""). kwok's node-initialize stage runs again
// whenever a node is not Ready: when kwok's Lease renewals lag on a busy machine, the node
// lifecycle controller marks the node's Ready Unknown (each node once within five minutes of
// the stopped 3,000 job size). A node without its address is one the API server cannot reach
// the log server through: every Job lease's log follow on it fails (hack/kwok/stages.yaml
// says why). The check marks each node Unknown as that
// controller does and waits for kwok to make it Ready again.
func (f *fleet) checkReinitialized(ctx context.Context, kubeletPort string) error {
	nodes := f.cs.CoreV1().Nodes()
	for _, name := range f.nodes {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for i, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
					n.Status.Conditions[i].Message = "scale: marked Unknown to check that kwok initializes the node again"
				}
			}
			_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("marking node %s Unknown: %w", name, err)
		}
	}
	if err := f.waitReady(ctx); err != nil {
		return fmt.Errorf("kwok initializing the nodes again: %w", err)
	}
	for _, name := range f.nodes {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ip := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		port := strconv.Itoa(int(n.Status.DaemonEndpoints.KubeletEndpoint.Port))
		if ip != "127.0.0.1" || (kubeletPort != "" && port != kubeletPort) {
			return fmt.Errorf("node %s, initialized again by kwok, has InternalIP %q and kubelet port %s, want 127.0.0.1 and %s (addresses %v): check the node stages of hack/kwok/stages.yaml",
				name, ip, port, kubeletPort, n.Status.Addresses)
		}
	}
	return nil
}

// waitReady waits until every fake node is Ready (kwok's node-initialize stage).
func (f *fleet) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ready := 0
		list, err := f.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: fleetLabel + "=true"})
		if err == nil {
			for _, n := range list.Items {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
		}
		if ready == len(f.nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%d of %d kwok nodes Ready after a minute (last error: %w)", ready, len(f.nodes), err)
			}
			return fmt.Errorf("%d of %d kwok nodes Ready after a minute", ready, len(f.nodes))
		}
		select {
		case err := <-f.done:
			if err == nil {
				err = errors.New("exit status 0") // as exec says any other
			}
			return fmt.Errorf("kwok exited: %w", err)
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stop deletes the fake nodes and the RuntimeClass, then stops kwok. Pods must be gone first
// (deleteTenants): kwok's pod-delete stage is what removes them.
func (f *fleet) stop(ctx context.Context) error {
	var errs []error
	list, err := f.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: fleetLabel + "=true"})
	if err != nil {
		errs = append(errs, fmt.Errorf("listing kwok nodes: %w", err))
	} else {
		for _, n := range list.Items {
			if err := f.cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting node %s: %w", n.Name, err))
			}
		}
	}
	if err := f.cs.NodeV1().RuntimeClasses().Delete(ctx, runtimeClass, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting RuntimeClass %s: %w", runtimeClass, err))
	}
	if f.cmd != nil && f.cmd.Process != nil {
		_ = f.cmd.Process.Kill()
		<-f.done //nolint:errcheck // "signal: killed", by the Kill above: the fleet is stopped on purpose
	}
	return errors.Join(errs...)
}
