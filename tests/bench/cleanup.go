package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

const (
	// namespacePrefix is the provider config's namespacePrefix: every tenant namespace of the
	// bench, the pipeline's and the raw ones, starts with it.
	namespacePrefix = "kcbench-"
	// sessionLabel marks every namespace the bench made with its session id. The pipeline's
	// tenant namespaces get it by a patch right after they appear, outside any timed window.
	sessionLabel = "bench.kubeclip.io/session"
	// cleanupPoll is how often cleanup looks whether the namespaces are gone.
	cleanupPoll = 2 * time.Second
)

// labelNamespace adds the session label to a namespace the pipeline created.
func labelNamespace(ctx context.Context, cs kubernetes.Interface, name, session string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{sessionLabel: session}}})
	if err != nil {
		return fmt.Errorf("encoding the label patch: %w", err)
	}
	_, err = cs.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: benchFieldManager})
	if err != nil {
		return fmt.Errorf("labelling namespace %s: %w", name, err)
	}
	return nil
}

// benchNamespaces lists the namespaces of every bench session, this one's and any an earlier,
// interrupted run left: those with the session label, and kubeclip tenants with the bench's
// prefix (a tenant the bench had no time to label).
func benchNamespaces(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, sel := range []string{sessionLabel, policy.ManagedBySelector} {
		list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("listing namespaces (%s): %w", sel, err)
		}
		for _, ns := range list.Items {
			if strings.HasPrefix(ns.Name, namespacePrefix) && !seen[ns.Name] {
				seen[ns.Name] = true
				names = append(names, ns.Name)
			}
		}
	}
	return names, nil
}

// cleanup deletes the bench's namespaces and waits, within ctx, until they are gone. It
// returns how many it deleted.
func cleanup(ctx context.Context, cs kubernetes.Interface) (int, error) {
	names, err := benchNamespaces(ctx, cs)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, name := range names {
		err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting namespace %s: %w", name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return len(names), err
	}
	return len(names), waitGone(ctx, cs)
}

// waitGone polls until no bench namespace is left.
func waitGone(ctx context.Context, cs kubernetes.Interface) error {
	t := time.NewTicker(cleanupPoll)
	defer t.Stop()
	for {
		left, err := benchNamespaces(ctx, cs)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d namespace(s) still terminating (e.g. %s); they go on their own: %w", len(left), left[0], context.Cause(ctx))
		case <-t.C:
		}
	}
}
