// Package k8s is the client-go layer of the kubeclip workers: client construction, server-side
// apply of a tenant, creation and deletion of run workloads, the error table that says which
// Kubernetes errors are worth a retry, and a resumable log follower. (What a run's Job and pod
// say about the run is pkg/runwatch/verdict's, which is pure.)
//
// Everything here talks to Kubernetes only; it never publishes events and never decides whether a
// failed message is retried. Errors keep the apimachinery status reachable (errors.As,
// apierrors.IsInvalid, ...) so the consume loop in pkg/events can classify them.
package k8s

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client-side rate limits, the workers' --kube-qps and --kube-burst defaults. client-go's
// defaults (QPS 5, Burst 10) are sized for kubectl; a dispatcher creates a Secret, a Job and a
// patch per run (3 calls), a release lists, deletes and watches pods, and a tenant apply is ~8
// objects, so at the 50 acquisitions/s kubeclip aims for a dispatcher alone needs 150 QPS, with
// bursts on top, and a lower limit queues work behind the client's own token bucket before the
// API server sees it. The API server's priority and fairness (APF) is the real protection; the
// client limit only has to stop a runaway loop, so it is set at twice the aimed-for load.
const (
	DefaultQPS   float32 = 300
	DefaultBurst int     = 600
)

// userAgentPrefix starts every kubeclip User-Agent, so API server audit logs and APF flow
// schemas can single the workers out.
const userAgentPrefix = "kubeclip"

// RESTConfig loads the client configuration of a worker.
//
// Order: an explicit kubeconfigPath is used as is (and must exist); otherwise the in-cluster
// service-account configuration; otherwise client-go's default loading rules ($KUBECONFIG, then
// ~/.kube/config). A non-positive qps or burst takes DefaultQPS / DefaultBurst. The User-Agent is
// "kubeclip"; use ForComponent to name the binary.
//
// Errors name the file that failed, never its contents: kubeconfigs hold bearer tokens and client
// keys, and the underlying parser errors are reduced to their position (see redactKubeconfigErr).
func RESTConfig(kubeconfigPath string, qps float32, burst int) (*rest.Config, error) {
	cfg, err := loadRESTConfig(kubeconfigPath)
	if err != nil {
		return nil, err
	}
	if qps <= 0 {
		qps = DefaultQPS
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.UserAgent = userAgentPrefix
	return cfg, nil
}

// ForComponent returns a copy of cfg whose User-Agent is "kubeclip/<component>" (for example
// "kubeclip/dispatcher").
func ForComponent(cfg *rest.Config, component string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.UserAgent = userAgentPrefix + "/" + component
	return c
}

func loadRESTConfig(kubeconfigPath string) (*rest.Config, error) {
	if kubeconfigPath != "" {
		// Read it once ourselves so a missing or unreadable file keeps its *fs.PathError (clientcmd
		// flattens it into a string together with parser errors that must be redacted).
		if _, err := os.ReadFile(kubeconfigPath); err != nil {
			return nil, fmt.Errorf("loading kubeconfig: %w", err)
		}
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfigPath},
			&clientcmd.ConfigOverrides{},
		).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfigPath, redactKubeconfigErr(err))
		}
		return cfg, nil
	}
	cfg, inClusterErr := rest.InClusterConfig()
	if inClusterErr == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if !errors.Is(inClusterErr, rest.ErrNotInCluster) {
			// Running in a pod whose service-account files are unreadable: say so too.
			return nil, fmt.Errorf("loading in-cluster config: %w; loading kubeconfig %v: %w",
				inClusterErr, rules.GetLoadingPrecedence(), redactKubeconfigErr(err))
		}
		return nil, fmt.Errorf("loading kubeconfig %v (not running in a cluster): %w",
			rules.GetLoadingPrecedence(), redactKubeconfigErr(err))
	}
	return cfg, nil
}

// redactKubeconfigErr keeps the kind of a kubeconfig loading error but not text that may quote
// the file. clientcmd's own errors (missing file, missing context, no server) name keys and
// paths only; decoder errors from the YAML/JSON layer can quote a fragment of the offending value,
// which may be a token, so those are replaced by a fixed message. errors.Is(err, fs.ErrNotExist)
// keeps working; an empty configuration becomes ErrNoConfig.
func redactKubeconfigErr(err error) error {
	if err == nil {
		return nil
	}
	if clientcmd.IsEmptyConfig(err) {
		return ErrNoConfig
	}
	if clientcmd.IsConfigurationInvalid(err) || isPathError(err) {
		return err
	}
	return errKubeconfigUnparsable
}

// ErrNoConfig means no kubeconfig (or no current context in it) was found and the process does
// not run in a pod.
var ErrNoConfig = errors.New("no Kubernetes client configuration: pass a kubeconfig path, set $KUBECONFIG, or run in a pod")

var errKubeconfigUnparsable = errors.New("kubeconfig is not valid YAML/JSON for a v1 Config (details withheld: they may quote credentials)")

func isPathError(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe)
}
