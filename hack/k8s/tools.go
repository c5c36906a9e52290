//go:build tools

// Package k8s pins the Kubernetes commands built for the local cluster, and the storage
// provisioner the cluster runs (built against the same k8s.io modules, so a cold build compiles
// them once for both).
package k8s

import (
	_ "github.com/rancher/local-path-provisioner"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
