// Package deps pins the module's dependencies while the packages that use them are written.
// Delete it once every import below is used elsewhere.
package deps

import (
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/oklog/ulid/v2"
	_ "github.com/rs/zerolog"
	_ "github.com/testcontainers/testcontainers-go"
	_ "go.uber.org/goleak"
	_ "k8s.io/api/batch/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	_ "k8s.io/client-go/dynamic"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "sigs.k8s.io/yaml"
)
