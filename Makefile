# vmaxdp: `make demo` and `make test` do all the set-up a fresh Debian
# machine needs (run as root: namespaces, XDP and AF_XDP need it).

GO        ?= go
CLANG     ?= clang-19
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
BIN       ?= bin
# The preload library's Go runtime defaults (preload/main.go says why):
# cmd/go accepts only the settings of its own table in //go:debug, so
# they are set where it keeps them.
PRELOAD_GODEBUG := containermaxprocs=0,asyncpreemptoff=1
PRELOAD_LDFLAGS := -X github.com/vmaxdp/vmaxdp/internal/engine.Version=$(VERSION) -X runtime.godebugDefault=$(PRELOAD_GODEBUG)
BPF_CFLAGS := -O2 -g -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu
# Debian packages the build, tests, benchmarks and demo use.
DEB_PKGS  := clang-19 llvm-19 gcc libc6-dev libbpf-dev linux-libc-dev bpftool iproute2 iputils-ping ethtool sockperf linux-perf tshark bc chromium \
	iperf3 iperf udpcast dnsperf knot unbound nsd bind9 pdns-recursor dnsmasq-base memcached libmemcached-tools redis-server redis-tools nginx-light lighttpd apache2-utils socat haproxy mosquitto mosquitto-clients freeradius freeradius-utils coturn kamailio sip-tester ngtcp2-server ngtcp2-client openvpn chrony gstreamer1.0-tools gstreamer1.0-plugins-good syslog-ng-core tftpd-hpa tftp-hpa snmpd snmp liburing-dev openjdk-17-jdk-headless nodejs libibverbs-dev ibverbs-providers
STAMP     := .deps.stamp

.PHONY: help deps build generate check-generate test test-short test-race bench fuzz fuzz-build demo lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

deps: $(STAMP) ## install the Debian packages and Go modules the project needs

$(STAMP): Makefile
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(GO) mod download
	@touch $@

build: ## build bin/vmaxdp, bin/libvmaxdp.so (vmaxdp run's preload library) and bin/nettrace (needs no clang: the BPF objects are committed); BIN=dir builds them there
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/vmaxdp ./cmd/vmaxdp
	$(GO) build -buildmode=c-shared -ldflags "$(PRELOAD_LDFLAGS)" -o $(BIN)/libvmaxdp.so ./preload
	rm -f $(BIN)/libvmaxdp.h
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/nettrace ./cmd/nettrace

generate: $(STAMP) ## rebuild the BPF objects and their Go bindings with clang-19
	cd bpf && BPF_CLANG=$(CLANG) BPF_CFLAGS="$(BPF_CFLAGS)" $(GO) generate ./...

check-generate: generate ## fail when the committed BPF output is stale
	@git diff --exit-code --stat -- bpf/ || { echo "bpf/: committed bpf2go output is stale: run make generate and commit"; exit 1; }

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt wants the files above"; exit 1; }
	$(GO) vet ./...

# The fuzz pass's builds (its instrumented packages took 2 of its 4
# minutes on a cold cache) are made beside the tests, at the lowest
# priority, where the long package (cmd/vmaxdp) leaves a CPU idle.
test: $(STAMP) lint check-generate ## all tests, privileged ones on real veth test beds (root)
	@nice -n 19 $(MAKE) --no-print-directory fuzz-build > /dev/null 2>&1 & \
	$(GO) test -count=1 -timeout 18m ./...; rc=$$?; wait; exit $$rc
	$(MAKE) --no-print-directory test-race
	$(MAKE) --no-print-directory fuzz FUZZTIME=6s

# The packages whose calls run concurrently on one socket (the engine serves
# every thread of an application) run again under the race detector.
RACE_PKGS := ./stack/... ./xsk/... ./steer/... ./internal/engine/... ./internal/record/... ./stats/...

test-race: $(STAMP) ## the engine's packages under the race detector
	$(GO) test -race -count=1 -timeout 5m $(RACE_PKGS)

test-short: ## tests without the fuzz pass and generate check
	$(GO) test -count=1 ./...

bench: $(STAMP) build ## benchmarks: go test -bench, then vmaxdp bench side by side with the kernel
	$(GO) test -run '^$$' -bench . -benchmem ./...
	./bin/vmaxdp bench -duration 3s
	./bench/sockperf.sh -t 3
	./bench/apps.sh
	./bench/nettrace.sh

FUZZTIME ?= 60s
# package:target pairs, every parser of untrusted input.
FUZZ := ./stack/header:FuzzParse ./internal/engine:FuzzParseSendCmsg ./stack:FuzzParseDiagMsg ./stack:FuzzNetstack ./stack:FuzzMemberOf ./stack:FuzzParseFIBRoute ./tracefile:FuzzReader ./tracefile:FuzzEvents ./tracefile:FuzzEventsRoundTrip ./internal/ksym:FuzzParse ./internal/snapshot:FuzzParsers ./report:FuzzBuild ./internal/rules:FuzzParse ./stats:FuzzDecode

fuzz-build: ## build what the fuzz pass runs, each target's package once (one input each)
	@for f in $(FUZZ); do \
		case " $$seen " in *" $${f%:*} "*) continue;; esac; seen="$$seen $${f%:*}"; \
		$(GO) test -run '^$$' -fuzz "^$${f#*:}$$" -fuzztime 1x "$${f%:*}" || exit 1; \
	done

# A run that fails with "context deadline exceeded" and writes no failing
# input met a race in Go's fuzzing coordinator at the -fuzztime deadline
# (golang/go#75804, fixed in Go 1.27, not in 1.26): it runs once more.
fuzz: ## fuzz every parser (FUZZTIME each, default 60s)
	@for f in $(FUZZ); do \
		echo "fuzz $${f#*:} in $${f%:*} for $(FUZZTIME)"; \
		for try in 1 2; do \
			out=$$($(GO) test -run '^$$' -fuzz "^$${f#*:}$$" -fuzztime $(FUZZTIME) "$${f%:*}" 2>&1) && break; \
			if [ $$try = 1 ] && echo "$$out" | grep -qx '    context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written'; then \
				echo "fuzz $${f#*:}: Go's fuzzing coordinator ended on its own deadline (golang/go#75804), no failing input: once more"; continue; \
			fi; \
			echo "$$out"; exit 1; \
		done; \
	done

demo: $(STAMP) build ## a plain test bed (as ip link add makes it): sockperf and knot under vmaxdp and on the kernel side by side, then a nettrace report
	./bench/sockperf.sh -t 2 -bed demo-sockperf
	./bin/vmaxdp bench apps -rounds 1 -duration 2s -apps knot,iperf3-64B
	./bin/vmaxdp testbed up -name demo -plain
	./bin/vmaxdp testbed status
	./bin/nettrace record -o demo.ntrace -netns vmx-demo-b -e all -- ./bin/vmaxdp bench -bed demo -duration 3s all
	./bin/nettrace script -i demo.ntrace -e drops | tail -n 8
	./bin/nettrace report -i demo.ntrace -top 5 -html -o demo.html
	./bin/nettrace report -i demo.ntrace -top 5
	@echo "the same report with plots: demo.html (open it in a browser)"
	./bin/vmaxdp testbed down -name demo

clean:
	rm -rf bin $(STAMP) demo.ntrace
