# kubeclip: `make test` is exactly what CI runs (.ci/run calls it).

GO            ?= go
BIN           := $(CURDIR)/bin
CACHE         ?= $(or $(KUBECLIP_CACHE),$(HOME)/.cache/kubeclip)
CLUSTER       := bash hack/cluster/cluster.sh
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(CACHE)/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
# Tests talk to a real nats-server and a real Kubernetes cluster; several run the worker binaries.
TEST_FLAGS    ?= -race -count=1 -timeout 45m

.PHONY: all build test unit fuzz vet fmt-check lint go-lint cluster-up cluster-down cluster-status images demo bench bench-scale clean \
	images-prod images-import deploy-dev undeploy-dev compose-up compose-down \
	plugin-deps plugin-build plugin-lint plugin-test plugin-pack plugin-e2e demo-paperclip

all: build

# A cold build or vet compiles for minutes: go_progress (hack/lib/progress.sh) says how far it is
# every 10 s, and nothing when it is quick.
GO_PROGRESS = . hack/lib/progress.sh && go_progress

build:
	@echo '$(GO) build -o $(BIN)/ ./cmd/...'
	@bash -c '$(GO_PROGRESS) "building the kubeclip binaries" . ./cmd/... -- $(GO) build -v -o $(BIN)/ ./cmd/...'

vet:
	@echo '$(GO) vet ./...'
	@bash -c '$(GO_PROGRESS) "go vet (compiling every package)" . -test ./... -- $(GO) vet -v ./...'

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# test: vet, gofmt, golangci-lint (.golangci.yaml; its govet runs vet's analyzers again, and vet
# stays as the quick check on its own), the Paperclip plugin's lint/typecheck and unit tests, then
# every Go test (unit, embedded NATS, the local cluster, end to end: tests/paperclip runs the real
# Paperclip server with the plugin and the worker binaries) with -race; then the Paperclip run
# figures.
# The log names every test that ran (hack/testreport over go test -json: a line per passing test,
# the whole output of a failing or skipped one); pipefail keeps go test's own exit status.
test: SHELL := /bin/bash
test: .SHELLFLAGS := -o pipefail -c
test: vet fmt-check lint build plugin-lint plugin-test cluster-up
	@rm -f $(BIN)/paperclip-e2e.txt
	$(GO) build -o $(BIN)/testreport ./hack/testreport
	KUBECLIP_BIN=$(BIN) KUBECLIP_CACHE=$(CACHE) KUBECLIP_PAPERCLIP_REPORT=$(BIN)/paperclip-e2e.txt $(GO) test $(TEST_FLAGS) -json ./... 2>&1 | $(BIN)/testreport
	@cat $(BIN)/paperclip-e2e.txt

# unit: the tests that need neither a cluster nor the worker binaries (quick feedback while editing).
unit:
	$(GO) test -race -count=1 ./pkg/... ./internal/...

# fuzz: every fuzz target (a func FuzzXxx in any package, found afresh each run) for FUZZTIME.
# Their seed corpora under testdata/fuzz run as ordinary tests in `make test`; an input that fails
# is written there, to be committed with the fix. Go minimizes each new input for up to 60 s by
# default, which can eat a short run whole; FUZZMINIMIZETIME bounds it.
FUZZTIME         ?= 30s
FUZZMINIMIZETIME ?= 10s
fuzz:
	@failed=; for dir in $$($(GO) list -f '{{.Dir}}' ./...); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go 2>/dev/null); do \
			pkg=./$${dir#$(CURDIR)/}; echo "== $$target $$pkg"; \
			$(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg || failed="$$failed $$target"; \
		done; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed"; exit 1; fi

# lint: the Go code (golangci-lint, .golangci.yaml) and the Paperclip plugin (typecheck, ESLint).
lint: go-lint plugin-lint

go-lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

# A cold build of golangci-lint compiles for minutes on 2 cores: go_progress says how far it is.
$(GOLANGCI_LINT):
	@mkdir -p $(dir $@)
	@echo 'GOBIN=$(CACHE)/tools/tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)'
	@bash -c '$(GO_PROGRESS) "building golangci-lint $(GOLANGCI_LINT_VERSION)" . -- env GOBIN=$(CACHE)/tools/tmp $(GO) install -v github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)'
	mv $(CACHE)/tools/tmp/golangci-lint $@

cluster-up:
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

cluster-status:
	$(CLUSTER) status

images:
	$(CLUSTER) images

# images-prod: the production images (FROM scratch, static, non-root) as docker-save tarballs in
# bin/images, built from Go sources with no Docker; images-import loads them into the local cluster.
images-prod:
	bash hack/images/images.sh build

images-import:
	bash hack/images/images.sh import

# deploy-dev: the dev overlay on the cluster of KUBECONFIG (needs cluster DNS, a storage
# provisioner and the images on the nodes; tests/deploy shows the local cluster's way). The
# namespace first, then random NATS passwords and sandbox key where none exist yet.
deploy-dev:
	kubectl apply --server-side -f deploy/kustomize/base/namespace.yaml
	bash hack/deploy/secrets.sh kubeclip
	kubectl apply --server-side -k deploy/kustomize/overlays/dev

undeploy-dev:
	kubectl delete --ignore-not-found -k deploy/kustomize/overlays/dev

# compose-up: the local stack (docker-compose.yaml) against KUBECLIP_COMPOSE_KUBECONFIG, with
# images loaded into Docker from local builds, and random NATS passwords, sandbox key and the
# credential broker's CA and sealing key made once into $(COMPOSE_SECRETS) (hack/compose/secrets.sh;
# never committed: bin/ is ignored).
# `docker compose` (v2) where the Docker CLI has it, else docker-compose (v1, Debian's).
COMPOSE_SECRETS := $(BIN)/compose
COMPOSE          = $(shell docker compose version >/dev/null 2>&1 && echo docker compose || echo docker-compose) --env-file $(COMPOSE_SECRETS)/secrets.env

compose-up:
	bash hack/images/images.sh load
	bash hack/compose/secrets.sh $(COMPOSE_SECRETS)
	$(COMPOSE) up -d

compose-down:
	$(COMPOSE) down

demo: build cluster-up
	$(BIN)/kubeclip demo --kubeconfig "$$($(CLUSTER) kubeconfig)"

bench: build cluster-up
	$(GO) run ./tests/bench --kubeconfig "$$($(CLUSTER) kubeconfig)"

clean:
	rm -rf $(BIN)

# ---- the Paperclip plugin (plugins/paperclip, TypeScript) ----
# Node 24 and npm come from hack/node/node.sh (the npm registry's tarballs, pinned, cached under
# $(CACHE)/node); npm's cache is $(CACHE)/npm. plugin-test needs the nats-server kubeclip pins, built with Go into $(CACHE)/bin.
PLUGIN_DIR          := plugins/paperclip
NODE_EXEC           := $(CURDIR)/hack/node/node.sh exec
NATS_SERVER_VERSION := $(shell grep -m1 -oE 'github.com/nats-io/nats-server/v2 v[^ ]+' go.mod | cut -d' ' -f2)
NATS_SERVER_BIN     := $(CACHE)/bin/nats-server-$(NATS_SERVER_VERSION)

# plugin-deps: npm ci, again only when package-lock.json changed.
plugin-deps: $(PLUGIN_DIR)/node_modules/.kubeclip-installed

$(PLUGIN_DIR)/node_modules/.kubeclip-installed: $(PLUGIN_DIR)/package-lock.json $(PLUGIN_DIR)/package.json hack/node/node.sh
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) $(NODE_EXEC) npm ci --no-audit --no-fund --prefer-offline
	touch $@

plugin-build: plugin-deps
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) $(NODE_EXEC) npm run build

plugin-lint: plugin-deps
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) $(NODE_EXEC) npm run typecheck
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) $(NODE_EXEC) npm run lint

plugin-test: plugin-deps $(NATS_SERVER_BIN)
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) NATS_SERVER_BIN=$(NATS_SERVER_BIN) $(NODE_EXEC) npm test

# plugin-pack: the installable tarball, bin/kubeclip-paperclip-plugin-<version>.tgz.
plugin-pack: plugin-build
	@mkdir -p $(BIN)
	cd $(PLUGIN_DIR) && KUBECLIP_CACHE=$(CACHE) $(NODE_EXEC) npm pack --pack-destination $(BIN)

# plugin-e2e: tests/paperclip alone, the part of `make test` that runs the real Paperclip server
# from npm (hack/paperclip/paperclip.sh, run as root: it creates the unprivileged user the server
# runs as) with this plugin and kubeclip's worker binaries on the local cluster.
plugin-e2e: build cluster-up
	@rm -f $(BIN)/paperclip-e2e.txt
	KUBECLIP_BIN=$(BIN) KUBECLIP_CACHE=$(CACHE) KUBECLIP_PAPERCLIP_REPORT=$(BIN)/paperclip-e2e.txt $(GO) test $(TEST_FLAGS) ./tests/paperclip
	@cat $(BIN)/paperclip-e2e.txt

# demo-paperclip: the real Paperclip server, the plugin and kubeclip (a local JetStream server and
# the worker binaries) on the local cluster; one agent run with its live log here, then
# Paperclip's address; Ctrl-C stops it all (hack/paperclip/demo.sh; needs root, like make test).
demo-paperclip: build plugin-deps cluster-up $(NATS_SERVER_BIN)
	KUBECLIP_CACHE=$(CACHE) bash hack/paperclip/demo.sh $(BIN) $(NATS_SERVER_BIN) "$$($(CLUSTER) kubeconfig)"

$(NATS_SERVER_BIN): go.mod
	@mkdir -p $(dir $@)
	$(GO) build -o $@.tmp github.com/nats-io/nats-server/v2
	mv $@.tmp $@

# bench-scale: 1,000, 3,000 and 10,000 concurrent leases of each of SCALE_BACKENDS (pod, job)
# through the worker binaries on a fleet of fake nodes kwok simulates on the local cluster
# (hack/kwok; tests/scale, docs/performance.md); the table (one column set per backend), plot (scale.svg)
# and JSON go to $(SCALE_OUT). The bench's API proxy and the job backend's log server get their
# certificates from the cluster's CA (the pki directory beside its kubeconfig). Not part of `make test`: the three pod
# sizes took about 30 min on this 2-core machine (10,000: 18 min), with other work on it.
SCALE_SIZES    ?= 1000,3000,10000
SCALE_BACKENDS ?= pod
SCALE_OUT      ?= $(BIN)/scale
bench-scale: build cluster-up
	kubeconfig="$$($(CLUSTER) kubeconfig)" && KUBECLIP_BIN=$(BIN) $(GO) run ./tests/scale --kubeconfig "$$kubeconfig" \
		--cluster-pki "$$(dirname "$$kubeconfig")/pki" --kwok "$$(KUBECLIP_CACHE=$(CACHE) bash hack/kwok/kwok.sh build)" \
		--sizes $(SCALE_SIZES) --backends $(SCALE_BACKENDS) --out $(SCALE_OUT)
