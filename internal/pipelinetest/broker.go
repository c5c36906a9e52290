package pipelinetest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

// CredentialBroker is the credential broker's binary (cmd/credential-broker, issue 27). A suite
// runs it with Options.Broker.
const CredentialBroker = "credential-broker"

// BrokerPort is where brokered pods reach the broker: the bound hosts' own port, since a pod
// calls https://api.anthropic.com by its name and /etc/hosts sends it to the broker's address.
const BrokerPort = 443

// brokerReadyTimeout bounds the broker's start: a NATS connection, a KV bucket, the grant
// cache's first load.
const brokerReadyTimeout = 30 * time.Second

// BrokerBinding is one brokered key of the broker's --bindings file, as
// cmd/credential-broker/bindings.go reads it.
type BrokerBinding struct {
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers"`
	// Errors is the refusals' error shape: anthropic, openai or google.
	Errors string `json:"errors"`
	// Upstreams overrides where the broker reaches a bound host (host → host:port): a local
	// server standing in for the real API. Its certificate must still name the host.
	Upstreams map[string]string `json:"upstreams,omitempty"`
}

// BrokerOptions are a suite's credential broker.
type BrokerOptions struct {
	// Address is the IP the broker's TLS listener binds, on BrokerPort: one that the cluster's
	// pods reach (PodReachableAddress).
	Address string
	// Bindings are the brokered keys; the installation CA is name-constrained to their hosts.
	Bindings map[string]BrokerBinding
	// UpstreamCA is PEM of the certificates the broker trusts for the upstreams besides the
	// system's (--upstream-ca): the local upstream's own.
	UpstreamCA []byte
	// Args adds flags.
	Args []string
}

// Broker is a suite's credential broker: its files, made by NewBroker before the workers start
// (the pods' wiring needs the CA's certificate), and its process, which Setup starts once the
// workers made the streams (it consumes the run stream) and before the suite's tests run.
type Broker struct {
	// Address and Port are where the proxy listens; pods reach the bound hosts there.
	Address string
	Port    int
	// Hosts are every bound host, sorted.
	Hosts []string
	// Dir holds the broker's files; CAFile is the installation CA's certificate (PEM, public),
	// the file the pods trust.
	Dir    string
	CAFile string
	// OpsURL is the broker's /healthz, /readyz and /metrics server, once started.
	OpsURL string
	// Process is the broker's process, once started.
	Process *Worker

	caKeyFile, sealingKeyFile, bindingsFile, upstreamCAFile string
	args                                                    []string
}

// NewBroker writes a fresh installation (a CA name-constrained to the bindings' hosts, made by
// pkg/broker/ca as `credential-broker ca` makes it; a random sealing key; the bindings file;
// the upstreams' CA) into a new temporary directory. Nothing runs yet: Options.Broker starts it.
func NewBroker(o BrokerOptions) (*Broker, error) {
	if net.ParseIP(o.Address) == nil {
		return nil, fmt.Errorf("BrokerOptions.Address: %q is not an IP address", o.Address)
	}
	if len(o.Bindings) == 0 {
		return nil, errors.New("BrokerOptions.Bindings: name at least one brokered key")
	}
	var hosts []string
	for _, b := range o.Bindings {
		for _, h := range b.Hosts {
			if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
	}
	slices.Sort(hosts)
	dir, err := os.MkdirTemp("", "kubeclip-broker-")
	if err != nil {
		return nil, err
	}
	b := &Broker{
		Address: o.Address, Port: BrokerPort, Hosts: hosts, Dir: dir,
		CAFile: filepath.Join(dir, "ca.pem"), caKeyFile: filepath.Join(dir, "ca.key"),
		sealingKeyFile: filepath.Join(dir, "sealing.key"), bindingsFile: filepath.Join(dir, "bindings.json"),
		args: o.Args,
	}
	if err := b.write(o); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

func (b *Broker) write(o BrokerOptions) error {
	authority, err := ca.Generate(ca.Options{Hosts: b.Hosts, Validity: 24 * time.Hour})
	if err != nil {
		return fmt.Errorf("making the installation CA: %w", err)
	}
	keyPEM, err := authority.KeyPEM()
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	sealing := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(sealing); err != nil {
		return err
	}
	defer clear(sealing)
	bindings, err := json.Marshal(o.Bindings)
	if err != nil {
		return err
	}
	type file struct {
		path string
		data []byte
		mode os.FileMode
	}
	files := []file{
		{b.CAFile, authority.CertPEM(), 0o644},
		{b.caKeyFile, keyPEM, 0o600},
		{b.sealingKeyFile, sealing, 0o600},
		{b.bindingsFile, bindings, 0o644},
	}
	if len(o.UpstreamCA) > 0 {
		b.upstreamCAFile = filepath.Join(b.Dir, "upstream-ca.pem")
		files = append(files, file{b.upstreamCAFile, o.UpstreamCA, 0o644})
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return fmt.Errorf("writing the broker's %s: %w", filepath.Base(f.path), err)
		}
	}
	return nil
}

// startBroker starts the broker's process and waits until its /readyz passes (its grant cache
// loaded, its mint service and proxy serving).
func (e *Env) startBroker(b *Broker) error {
	opsAddr, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	args := []string{
		"--bindings", b.bindingsFile, "--ca-cert", b.CAFile, "--ca-key", b.caKeyFile,
		"--sealing-key", b.sealingKeyFile, "--listen", net.JoinHostPort(b.Address, strconv.Itoa(b.Port)),
		"--ops-addr", opsAddr,
	}
	if b.upstreamCAFile != "" {
		args = append(args, "--upstream-ca", b.upstreamCAFile)
	}
	w, err := e.StartWorker(CredentialBroker, append(args, b.args...)...)
	if err != nil {
		return err
	}
	b.Process, b.OpsURL = w, "http://"+opsAddr
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(brokerReadyTimeout)
	for {
		resp, err := client.Get(b.OpsURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if w.Exited() {
			return fmt.Errorf("%s exited at start (log %s)", w.ID, w.LogPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (log %s)", w.ID, brokerReadyTimeout, w.LogPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeLoopbackAddr is a loopback address with a port free a moment ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// PodReachableAddress is an address of this machine that the local cluster's pods reach: its
// node's InternalIP (the cluster is this machine's single node, hack/cluster/cluster.sh; pods
// reach the node's address through their bridge). A broker bound there is what the bound hosts
// resolve to in brokered pods.
func PodReachableAddress(ctx context.Context, kubeconfig string) (string, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", fmt.Errorf("reading the kubeconfig %s: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing the cluster's nodes (is it up? make cluster-up): %w", err)
	}
	var ips []string
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, a.Address)
			}
		}
	}
	if len(nodes.Items) != 1 || len(ips) == 0 {
		return "", fmt.Errorf("the cluster has %d nodes with InternalIPs %v: want this machine as its one node (hack/cluster)", len(nodes.Items), ips)
	}
	return ips[0], nil
}
