# Leasehold. `make help` lists the targets; `make ci` is what CI runs.
SHELL := /bin/bash
GO ?= go
GOBIN ?= $(shell $(GO) env GOPATH)/bin
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION := v0.8.2
PROTO_FILES := $(wildcard proto/leasehold/v1/*.proto)
# Long fault scenarios run when LONG=1 (CI sets it); -short skips them locally.
TEST_FLAGS ?= $(if $(LONG),,-short)

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: tools
tools: ## Install the pinned code generators and linters.
	GOBIN=$(GOBIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(GOBIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	GOBIN=$(GOBIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: proto
proto: ## Regenerate Go code from proto/ (protoc, protoc-gen-go, protoc-gen-go-grpc).
	PATH=$(GOBIN):$$PATH protoc -I proto -I /usr/include \
	  --go_out=. --go_opt=module=leasehold \
	  --go-grpc_out=. --go-grpc_opt=module=leasehold \
	  $(PROTO_FILES)

.PHONY: checkproto
checkproto: proto ## Fail when the committed generated code differs from proto/.
	@git diff --exit-code -- proto/ || { echo "generated code drifted: run make proto and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- proto/)" || { git status --porcelain -- proto/; echo "untracked generated files: run make proto and commit" >&2; exit 1; }

.PHONY: lint
lint: ## go vet, staticcheck, gofmt, and go.mod kept tidy.
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); test -z "$$out" || { echo "gofmt needed: $$out" >&2; exit 1; }

.PHONY: test
test: ## Run the tests, -race and -short (LONG=1: the long ones too, as CI does; redis-server installed when missing).
	@./.ci/install-deps
	@set -o pipefail; $(GO) test -race -count=1 -timeout 25m $(TEST_FLAGS) ./... 2>&1 | tee test.log || \
	  { rc=$$?; $(GO) run ./internal/testsummary < test.log; exit $$rc; }
	@$(MAKE) --no-print-directory explore

.PHONY: explore
explore: ## Explore the protocol's CI scopes (clean build: no violation) and find every seeded bug (docs/verification.md).
	@set -o pipefail; $(GO) test -count=1 -timeout 15m -tags leasehold_seeded -run '^(TestCIScopes|TestSeededBugsFound)$$' -v ./simulations/explore/ 2>&1 | \
	  tee -a test.log | grep -E '^(---|ok|FAIL|panic)|_test.go:[0-9]+: [a-z]' || \
	  { rc=$$?; $(GO) run ./internal/testsummary < test.log; exit $$rc; }

.PHONY: bench
bench: ## Run the benchmarks (results in bench.txt; compare runs with benchstat).
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./... | tee bench.txt

.PHONY: bench-check
bench-check: ## The agent against a do-nothing gRPC server, real processes, same driver: one table (docs/benchmarks.md; BENCH_CHECK_FLAGS).
	$(GO) run ./internal/benchcheck $(BENCH_CHECK_FLAGS)

.PHONY: fuzz
fuzz: ## Run every fuzzer for FUZZTIME each (default 20s; all of them, then fail if any found something).
	@GO=$(GO) .ci/fuzz

.PHONY: ci
ci: checkproto lint ## What CI runs: proto drift check, lint, and every test.
	$(MAKE) test LONG=1

.PHONY: sim
sim: ## Run the simulations and write docs/simulations/ (report and plots).
	$(GO) run ./simulations/cmd/sim -out docs/simulations -seed 1

.PHONY: screenshots
screenshots: ## Write docs/images/status.png: /status of `leasehold dev` in headless Chromium.
	@command -v chromium >/dev/null || { echo "chromium not found: apt-get install -y chromium" >&2; exit 1; }
	$(GO) test -count=1 -run '^TestStatusPageInChromium$$' ./cmd/leasehold -args -screenshot=$(CURDIR)/docs/images/status.png

.PHONY: faults-report
faults-report: ## Run the fault scenarios (real processes) and regenerate docs/faults.md.
	rm -f docs/faults.md
	LEASEHOLD_FAULTS_REPORT=docs/faults.md $(GO) test -count=1 -v -timeout 20m -run Scenario ./internal/faulttest/
