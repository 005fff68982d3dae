package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"go/build"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"leasehold/regionagent/client"
)

// The Kubernetes manifests (deploy/kubernetes) and the image's Dockerfile
// (deploy/docker), held against the binaries: every object decodes
// strictly into the Kubernetes API's own types, every container's args
// are flags the command really has (and pass its own validation), probes
// and PodMonitor endpoints name the listen ports and paths the servers
// really serve, Services reach container ports, and addresses between
// components name Services and ports that exist.

const manifestDir = "../../deploy/kubernetes"

// podMonitor is prometheus-operator's PodMonitor (monitoring.coreos.com/v1),
// the fields these manifests may use: decoded strictly, an unknown or
// misspelled field is an error (its Go types are a heavy dependency).
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		JobLabel            string   `json:"jobLabel,omitempty"`
		PodTargetLabels     []string `json:"podTargetLabels,omitempty"`
		PodMetricsEndpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			TLSConfig     *struct {
				CA *struct {
					Secret *corev1.SecretKeySelector `json:"secret,omitempty"`
				} `json:"ca,omitempty"`
				ServerName         string `json:"serverName,omitempty"`
				InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
			} `json:"tlsConfig,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// manifest is one decoded object.
type manifest struct {
	where string // file and document index
	kind  string
	obj   any
}

// decodeStrict decodes one YAML document into the type of its apiVersion
// and kind; unknown kinds and unknown fields are errors.
func decodeStrict(doc []byte) (kind string, obj any, err error) {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return "", nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return "", nil, err
	}
	kind = tm.APIVersion + " " + tm.Kind
	switch kind {
	case "v1 Namespace":
		obj = &corev1.Namespace{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1 PodMonitor":
		obj = &podMonitor{}
	default:
		return kind, nil, fmt.Errorf("unexpected object %q", kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return kind, nil, err
	}
	return kind, obj, nil
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

func readManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	var out []manifest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSep.Split(string(b), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			where := fmt.Sprintf("%s#%d", filepath.Base(f), i)
			kind, obj, err := decodeStrict([]byte(doc))
			if err != nil {
				t.Errorf("%s (%s): %v", where, kind, err)
				continue
			}
			out = append(out, manifest{where: where, kind: kind, obj: obj})
		}
	}
	return out
}

// TestManifestDecodingIsStrict: a misspelled field, a field of another
// object or an unknown kind is refused, so the test below would see one.
func TestManifestDecodingIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"typo in a container": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: c, image: i, containerPorts: [{containerPort: 1}]}]\n",
		"unknown top field":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 1}]}\nstatus2: {}\n",
		"PodMonitor typo":     "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec:\n  selector: {}\n  podMetricsEndpoints: [{port: http, intervall: 5s}]\n",
		"unknown kind":        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
	} {
		if _, _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	if _, _, err := decodeStrict([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 1}]}\n")); err != nil {
		t.Errorf("a valid Service: %v", err)
	}
}

// workload is a StatefulSet's or Deployment's pod template.
type workload struct {
	name, namespace string
	replicas        int32
	serviceName     string // StatefulSet only
	labels          map[string]string
	pod             corev1.PodSpec
	servers         []*server // the leasehold containers
}

// server is a leasehold container as its args configure it.
type server struct {
	command            string // allocator, agent, gateway
	container          *corev1.Container
	grpcPort, httpPort int  // from the listen flags (0: none)
	tls                bool // its HTTP port serves TLS
	handler            *http.ServeMux
	// metricsPort serves /metrics (metrics): the HTTP port of an allocator
	// or an agent, a gateway's -metrics-addr (0: off).
	metricsPort int
	metrics     *http.ServeMux
	args        []string
	flags       map[string]string // flag name -> value, as given
	allocator   allocatorConfig
	agent       agentConfig
	gateway     gatewayConfig
}

type allowAll struct{}

func (allowAll) Allow(context.Context, string, int64) (client.Decision, error) {
	return client.Decision{Allowed: true}, nil
}

// parseServer parses a leasehold container's args with the command's own
// flag set and validation.
func parseServer(c *corev1.Container) (*server, error) {
	if len(c.Command) > 0 {
		return nil, fmt.Errorf("command %q overrides the image's entrypoint (/leasehold)", c.Command)
	}
	if len(c.Args) == 0 {
		return nil, errors.New("no args: the first must name the command")
	}
	s := &server{command: c.Args[0], container: c, args: c.Args[1:], flags: map[string]string{}}
	fs := flag.NewFlagSet(s.command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var validate func() error
	switch s.command {
	case "allocator":
		s.allocator.register(fs)
		validate = s.allocator.validate
	case "agent":
		s.agent.register(fs)
		validate = s.agent.validate
	case "gateway":
		s.gateway.register(fs)
		validate = s.gateway.validate
	default:
		return nil, fmt.Errorf("command %q: not a server command of leasehold", s.command)
	}
	if err := fs.Parse(s.args); err != nil {
		return nil, fmt.Errorf("leasehold %s: %v", s.command, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("leasehold %s: unexpected argument %q", s.command, fs.Arg(0))
	}
	if err := validate(); err != nil {
		return nil, fmt.Errorf("leasehold %s: %v", s.command, err)
	}
	fs.Visit(func(f *flag.Flag) { s.flags[f.Name] = f.Value.String() })
	port := func(name, addr string) (int, error) {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return 0, fmt.Errorf("-%s %q: %v", name, addr, err)
		}
		return strconv.Atoi(p)
	}
	var err error
	switch s.command {
	case "allocator":
		if s.grpcPort, err = port("grpc-addr", s.allocator.grpcAddr); err == nil {
			s.httpPort, err = port("http-addr", s.allocator.httpAddr)
		}
		s.tls = s.allocator.tls.cert != ""
		s.handler = metricsMux(newRegistry(), func() (bool, string) { return true, "ok" })
		s.metricsPort, s.metrics = s.httpPort, s.handler
	case "agent":
		if s.grpcPort, err = port("grpc-addr", s.agent.grpcAddr); err == nil {
			s.httpPort, err = port("http-addr", s.agent.httpAddr)
		}
		s.tls = s.agent.tls.cert != ""
		s.handler = metricsMux(newRegistry(), func() (bool, string) { return true, "ok" })
		s.metricsPort, s.metrics = s.httpPort, s.handler
	case "gateway":
		s.httpPort, err = port("listen", s.gateway.listen)
		s.tls = s.gateway.tls.cert != ""
		h, ok := gatewayHandler(&s.gateway, allowAll{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil))).(*http.ServeMux)
		if !ok {
			return nil, errors.New("gatewayHandler is no longer a *http.ServeMux: update this test")
		}
		s.handler = h
		if m := s.gateway.metricsAddr; err == nil && m != "" && m != "off" {
			s.metricsPort, err = port("metrics-addr", m)
			s.metrics = metricsMux(newRegistry(), func() (bool, string) { return true, "ok" })
		}
	}
	return s, err
}

// serves reports whether the server's HTTP mux has a route of its own for
// GET path (not the gateway's catch-all proxy) that answers 200.
func (s *server) serves(path string) error { return s.servesOn(s.handler, path) }

func (s *server) servesOn(mux *http.ServeMux, path string) error {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	_, pattern := mux.Handler(req)
	if pattern != "GET "+path && pattern != path {
		return fmt.Errorf("leasehold %s serves no GET %s (the route is %q)", s.command, path, pattern)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return fmt.Errorf("leasehold %s: GET %s answers %d", s.command, path, rec.Code)
	}
	return nil
}

// containerPort resolves a probe's or Service's port (number or name) in
// the pod's containers.
func containerPort(pod corev1.PodSpec, c *corev1.Container, p intstr.IntOrString) (int, error) {
	containers := pod.Containers
	if c != nil {
		containers = []corev1.Container{*c}
	}
	for _, c := range containers {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return int(cp.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("no container port %s", p.String())
}

// certs is what `leasehold certs` writes for regions eu and us with the
// --hosts docs/deploy.md gives: the file names, and the server
// certificate.
type certs struct {
	files  map[string]bool
	server *x509.Certificate
}

func makeCerts(t *testing.T) certs {
	t.Helper()
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`leasehold certs [^\n]*\\\n\s*--hosts '([^']+)'`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deploy.md: no `leasehold certs ... --hosts '...'` command")
	}
	dir := t.TempDir()
	if err := runCertsCmd(context.Background(), []string{"--dir", dir, "--regions", "eu,us", "--hosts", string(m[1])}, io.Discard, io.Discard); err != nil {
		t.Fatalf("leasehold certs: %v", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := certs{files: map[string]bool{}}
	for _, e := range ents {
		c.files[e.Name()] = true
	}
	b, err := os.ReadFile(filepath.Join(dir, serverCertFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("server certificate: no PEM block")
	}
	if c.server, err = x509.ParseCertificate(blk.Bytes); err != nil {
		t.Fatal(err)
	}
	return c
}

// checkServerName reports whether the server certificate of docs/deploy.md
// is valid for the host of addr (HOST:PORT or a bare host).
func (c certs) checkServerName(addr string) error {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if err := c.server.VerifyHostname(host); err != nil {
		return fmt.Errorf("the server certificate of docs/deploy.md (leasehold certs --hosts) does not name %s: %v", host, err)
	}
	return nil
}

// TestKubernetesManifests decodes every manifest strictly and holds the
// workloads, Services and the PodMonitor against the binaries.
func TestKubernetesManifests(t *testing.T) {
	objs := readManifests(t)
	certs := makeCerts(t)
	var workloads []*workload
	var services []*corev1.Service
	var monitors []*podMonitor
	var policies []*networkingv1.NetworkPolicy
	namespaces := map[string]bool{}
	for _, m := range objs {
		switch o := m.obj.(type) {
		case *corev1.Namespace:
			namespaces[o.Name] = true
		case *corev1.Service:
			services = append(services, o)
		case *appsv1.StatefulSet:
			workloads = append(workloads, &workload{name: o.Name, namespace: o.Namespace, replicas: ptrOr(o.Spec.Replicas, 1),
				serviceName: o.Spec.ServiceName, labels: o.Spec.Template.Labels, pod: o.Spec.Template.Spec})
			checkSelector(t, m.where, o.Spec.Selector, o.Spec.Template.Labels)
		case *appsv1.Deployment:
			workloads = append(workloads, &workload{name: o.Name, namespace: o.Namespace, replicas: ptrOr(o.Spec.Replicas, 1),
				labels: o.Spec.Template.Labels, pod: o.Spec.Template.Spec})
			checkSelector(t, m.where, o.Spec.Selector, o.Spec.Template.Labels)
		case *podMonitor:
			monitors = append(monitors, o)
		case *networkingv1.NetworkPolicy:
			policies = append(policies, o)
		}
	}
	for _, m := range objs {
		checkNames(t, m)
	}
	byCommand := map[string][]*workload{}
	for _, w := range workloads {
		if !namespaces[w.namespace] {
			t.Errorf("%s: namespace %q is not among the manifests", w.name, w.namespace)
		}
		for i := range w.pod.Containers {
			c := &w.pod.Containers[i]
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() ||
				c.Resources.Limits.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s/%s: cpu and memory requests and limits are required", w.name, c.Name)
			}
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				t.Errorf("%s/%s: readiness and liveness probes are required", w.name, c.Name)
			}
			if !strings.HasPrefix(c.Image, "leasehold:") {
				continue
			}
			s, err := parseServer(c)
			if err != nil {
				t.Errorf("%s/%s: %v", w.name, c.Name, err)
				continue
			}
			w.servers = append(w.servers, s)
			byCommand[s.command] = append(byCommand[s.command], w)
			checkServer(t, w, s, certs)
		}
	}
	for _, cmd := range []string{"allocator", "agent", "gateway"} {
		if len(byCommand[cmd]) == 0 {
			t.Errorf("no workload runs leasehold %s", cmd)
		}
	}

	// Services: each selects one workload and reaches its container ports.
	svcByName := map[string]*corev1.Service{}
	for _, svc := range services {
		svcByName[svc.Name] = svc
		var sel []*workload
		for _, w := range workloads {
			if w.namespace == svc.Namespace && len(svc.Spec.Selector) > 0 &&
				labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.labels)) {
				sel = append(sel, w)
			}
		}
		if len(sel) != 1 {
			t.Errorf("service %s selects %d workloads, want 1", svc.Name, len(sel))
			continue
		}
		for _, p := range svc.Spec.Ports {
			tp := p.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(p.Port)
			}
			if _, err := containerPort(sel[0].pod, nil, tp); err != nil {
				t.Errorf("service %s port %s: targetPort %s: %v in %s", svc.Name, p.Name, tp.String(), err, sel[0].name)
			}
		}
	}
	for _, w := range workloads {
		if w.serviceName != "" && svcByName[w.serviceName] == nil {
			t.Errorf("statefulset %s: serviceName %s is no Service", w.name, w.serviceName)
		}
	}

	// Addresses between components name Services (or StatefulSet pods)
	// and the ports the server behind them listens on.
	serviceTarget := func(addr string) (*workload, int, error) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, 0, err
		}
		port, _ := strconv.Atoi(p)
		svc := svcByName[strings.Split(host, ".")[0]]
		if svc == nil {
			return nil, 0, fmt.Errorf("%s: no Service %s", addr, host)
		}
		for _, w := range workloads {
			if w.namespace != svc.Namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.labels)) {
				continue
			}
			for _, sp := range svc.Spec.Ports {
				if int(sp.Port) == port {
					cp, err := containerPort(w.pod, nil, sp.TargetPort)
					return w, cp, err
				}
			}
			return nil, 0, fmt.Errorf("%s: service %s has no port %d", addr, svc.Name, port)
		}
		return nil, 0, fmt.Errorf("%s: service %s selects nothing", addr, svc.Name)
	}
	for _, w := range byCommand["agent"] {
		for _, s := range w.servers {
			wr, port, err := serviceTarget(s.agent.redis)
			if err != nil || port != 6379 || !slices.ContainsFunc(wr.pod.Containers, func(c corev1.Container) bool { return strings.HasPrefix(c.Image, "redis:") }) {
				t.Errorf("%s: -redis %s does not reach a Redis: %v", w.name, s.agent.redis, err)
			} else if wr.labels["leasehold.region"] != s.agent.region {
				t.Errorf("%s (region %s): -redis %s is region %q's", w.name, s.agent.region, s.agent.redis, wr.labels["leasehold.region"])
			}
			allocs := byCommand["allocator"]
			for _, a := range splitList(s.agent.allocators) {
				if err := checkPodAddr(a, allocs); err != nil {
					t.Errorf("%s: -allocator: %v", w.name, err)
				}
				if err := certs.checkServerName(a); s.agent.tls.ca != "" && err != nil {
					t.Errorf("%s: -allocator: %v", w.name, err)
				}
			}
			if n := len(splitList(s.agent.allocators)); len(allocs) == 1 && n != int(allocs[0].replicas) {
				t.Errorf("%s: -allocator names %d replicas, the StatefulSet runs %d", w.name, n, allocs[0].replicas)
			}
		}
	}
	for _, w := range byCommand["gateway"] {
		for _, s := range w.servers {
			if err := certs.checkServerName(s.gateway.agent); s.gateway.tls.ca != "" && err != nil {
				t.Errorf("%s: -agent: %v", w.name, err)
			}
			wa, port, err := serviceTarget(s.gateway.agent)
			if err != nil || len(wa.servers) != 1 || wa.servers[0].command != "agent" || wa.servers[0].grpcPort != port {
				t.Errorf("%s: -agent %s does not reach an agent's gRPC port: %v", w.name, s.gateway.agent, err)
			} else if wa.labels["leasehold.region"] != w.labels["leasehold.region"] {
				t.Errorf("%s: -agent %s is in region %q, the gateway in %q", w.name, s.gateway.agent, wa.labels["leasehold.region"], w.labels["leasehold.region"])
			}
		}
	}
	for _, w := range byCommand["allocator"] {
		for _, s := range w.servers {
			want := fmt.Sprintf("$(POD_NAME).%s.%s.svc:%d", w.serviceName, w.namespace, s.grpcPort)
			if s.allocator.advertise != want {
				t.Errorf("%s: -advertise %q, want %q (each replica's own name)", w.name, s.allocator.advertise, want)
			}
			for i := range int(w.replicas) {
				pod := strings.ReplaceAll(s.allocator.advertise, "$(POD_NAME)", fmt.Sprintf("%s-%d", w.name, i))
				if err := certs.checkServerName(pod); s.tls && err != nil {
					t.Errorf("%s: -advertise: %v", w.name, err)
				}
			}
			if err := certs.checkServerName(fmt.Sprintf("%s.%s.svc", "leasehold-allocator", w.namespace)); s.tls && err != nil {
				t.Errorf("%s: %v", w.name, err)
			}
			if !slices.ContainsFunc(s.container.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
			}) {
				t.Errorf("%s: POD_NAME (-advertise) is not the pod's name", w.name)
			}
			if s.allocator.etcdEndpoints == "" {
				t.Errorf("%s: no -etcd-endpoints: the allocator would run an embedded etcd member", w.name)
			}
		}
	}

	// NetworkPolicies: each protects one workload, on its ports, and lets
	// in every agent whose -redis names it.
	for _, np := range policies {
		target := selectWorkloads(t, "networkpolicy "+np.Name, workloads, np.Namespace, &np.Spec.PodSelector)
		if len(target) != 1 {
			t.Errorf("networkpolicy %s selects %d workloads, want 1", np.Name, len(target))
			continue
		}
		allowed := map[*workload]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, peer := range rule.From {
				if peer.PodSelector == nil {
					continue
				}
				for _, w := range selectWorkloads(t, "networkpolicy "+np.Name, workloads, np.Namespace, peer.PodSelector) {
					allowed[w] = true
				}
			}
			for _, p := range rule.Ports {
				if p.Port == nil {
					continue
				}
				if _, err := containerPort(target[0].pod, nil, *p.Port); err != nil {
					t.Errorf("networkpolicy %s: port %s: %v in %s", np.Name, p.Port.String(), err, target[0].name)
				}
			}
		}
		for _, w := range byCommand["agent"] {
			for _, s := range w.servers {
				if wr, _, err := serviceTarget(s.agent.redis); err == nil && wr == target[0] && !allowed[w] {
					t.Errorf("networkpolicy %s shuts out %s, whose -redis is %s", np.Name, w.name, s.agent.redis)
				}
			}
		}
	}

	// The PodMonitor scrapes every allocator, agent and gateway on the
	// port that serves its /metrics.
	if len(monitors) == 0 {
		t.Error("no PodMonitor")
	}
	scraped := map[string]bool{}
	for _, pm := range monitors {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil {
			t.Errorf("podmonitor %s: %v", pm.Name, err)
			continue
		}
		for _, w := range workloads {
			if w.namespace != pm.Namespace || !sel.Matches(labels.Set(w.labels)) {
				continue
			}
			if len(w.servers) != 1 || w.servers[0].metricsPort == 0 {
				t.Errorf("podmonitor %s selects %s, which serves no /metrics", pm.Name, w.name)
				continue
			}
			s := w.servers[0]
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				p, err := containerPort(w.pod, s.container, intstr.FromString(ep.Port))
				if err != nil || p != s.metricsPort {
					t.Errorf("podmonitor %s: port %q of %s is %d (%v), its /metrics is on %d", pm.Name, ep.Port, w.name, p, err, s.metricsPort)
				}
				path := cmpOr(ep.Path, "/metrics")
				if err := s.servesOn(s.metrics, path); err != nil {
					t.Errorf("podmonitor %s on %s: %v", pm.Name, w.name, err)
				}
				if (ep.Scheme == "https") != s.tls {
					t.Errorf("podmonitor %s: scheme %q, but %s serves TLS: %v", pm.Name, ep.Scheme, w.name, s.tls)
				}
				if s.tls && (ep.TLSConfig == nil || ep.TLSConfig.CA == nil || ep.TLSConfig.CA.Secret == nil || !certs.files[ep.TLSConfig.CA.Secret.Key]) {
					t.Errorf("podmonitor %s: TLS without the CA of leasehold certs", pm.Name)
				} else if s.tls {
					if err := certs.checkServerName(ep.TLSConfig.ServerName); err != nil {
						t.Errorf("podmonitor %s: serverName: %v", pm.Name, err)
					}
				}
			}
			scraped[w.name] = true
		}
	}
	for _, cmd := range []string{"allocator", "agent", "gateway"} {
		for _, w := range byCommand[cmd] {
			if !scraped[w.name] {
				t.Errorf("%s is scraped by no PodMonitor", w.name)
			}
		}
	}
}

// checkNames applies the API server's rules for names, labels and port
// names (DNS-1123 labels, qualified label keys, IANA service names), which
// decoding alone does not check.
func checkNames(t *testing.T, m manifest) {
	t.Helper()
	o, ok := m.obj.(metav1.Object)
	if !ok {
		t.Errorf("%s: %T has no object metadata", m.where, m.obj)
		return
	}
	bad := func(what string, errs []string) {
		if len(errs) > 0 {
			t.Errorf("%s: %s: %s", m.where, what, strings.Join(errs, "; "))
		}
	}
	bad("name "+o.GetName(), validation.IsDNS1123Label(o.GetName()))
	checkLabels := func(where string, l map[string]string) {
		for k, v := range l {
			bad(where+" label key "+k, validation.IsQualifiedName(k))
			bad(where+" label "+k+" value "+v, validation.IsValidLabelValue(v))
		}
	}
	checkLabels("metadata", o.GetLabels())
	var pod *corev1.PodTemplateSpec
	switch x := m.obj.(type) {
	case *appsv1.StatefulSet:
		pod = &x.Spec.Template
	case *appsv1.Deployment:
		pod = &x.Spec.Template
	case *corev1.Service:
		for _, p := range x.Spec.Ports {
			bad("service port name "+p.Name, validation.IsValidPortName(p.Name))
			if p.TargetPort.Type == intstr.String {
				bad("targetPort "+p.TargetPort.StrVal, validation.IsValidPortName(p.TargetPort.StrVal))
			}
		}
	}
	if pod == nil {
		return
	}
	checkLabels("pod template", pod.Labels)
	for _, c := range pod.Spec.Containers {
		bad("container name "+c.Name, validation.IsDNS1123Label(c.Name))
		for _, p := range c.Ports {
			bad("container port name "+p.Name, validation.IsValidPortName(p.Name))
			bad(fmt.Sprintf("container port %d", p.ContainerPort), validation.IsValidPortNum(int(p.ContainerPort)))
		}
		for _, e := range c.Env {
			bad("env "+e.Name, validation.IsEnvVarName(e.Name))
		}
	}
	for _, v := range pod.Spec.Volumes {
		bad("volume "+v.Name, validation.IsDNS1123Label(v.Name))
	}
}

// checkServer holds one leasehold container against its flags: ports,
// probes, mounted files.
func checkServer(t *testing.T, w *workload, s *server, certs certs) {
	t.Helper()
	name := w.name + "/" + s.container.Name
	listen := map[int]bool{s.httpPort: true}
	for _, p := range []int{s.grpcPort, s.metricsPort} {
		if p != 0 {
			listen[p] = true
		}
	}
	for _, cp := range s.container.Ports {
		if !listen[int(cp.ContainerPort)] {
			t.Errorf("%s: container port %s/%d is no port leasehold %s listens on (%v)", name, cp.Name, cp.ContainerPort, s.command, listen)
		}
		delete(listen, int(cp.ContainerPort))
	}
	if len(listen) > 0 {
		t.Errorf("%s: listens on %v, not declared as container ports", name, listen)
	}
	for kind, p := range map[string]*corev1.Probe{"readiness": s.container.ReadinessProbe, "liveness": s.container.LivenessProbe, "startup": s.container.StartupProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s: %s probe: want an HTTP GET of the server's health path", name, kind)
			continue
		}
		port, err := containerPort(w.pod, s.container, p.HTTPGet.Port)
		if err != nil || port != s.httpPort {
			t.Errorf("%s: %s probe port %s is %d (%v), the HTTP server listens on %d", name, kind, p.HTTPGet.Port.String(), port, err, s.httpPort)
		}
		if (p.HTTPGet.Scheme == corev1.URISchemeHTTPS) != s.tls {
			t.Errorf("%s: %s probe scheme %q, but the server's TLS is %v", name, kind, p.HTTPGet.Scheme, s.tls)
		}
		if err := s.serves(p.HTTPGet.Path); err != nil {
			t.Errorf("%s: %s probe: %v", name, kind, err)
		}
	}
	// Files named by flags: on a mounted Secret, named as leasehold
	// certs names them (the external etcd's client files excepted).
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range s.container.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for flagName, v := range s.flags {
		if !strings.HasPrefix(v, "/") {
			continue
		}
		m, ok := mounts[filepath.Dir(v)]
		if !ok {
			t.Errorf("%s: -%s %s: no volume is mounted at %s", name, flagName, v, filepath.Dir(v))
			continue
		}
		i := slices.IndexFunc(w.pod.Volumes, func(vol corev1.Volume) bool { return vol.Name == m.Name })
		if i < 0 || w.pod.Volumes[i].Secret == nil {
			t.Errorf("%s: -%s %s: volume %s is not a Secret", name, flagName, v, m.Name)
			continue
		}
		if !strings.HasPrefix(flagName, "etcd-") && !certs.files[filepath.Base(v)] {
			t.Errorf("%s: -%s %s: leasehold certs writes no %s", name, flagName, v, filepath.Base(v))
		}
	}
	if s.command == "agent" {
		cert := s.agent.allocCert
		if want, _ := agentFiles(s.agent.region); filepath.Base(cert) != want {
			t.Errorf("%s: region %s presents %s to the allocator, want %s", name, s.agent.region, cert, want)
		}
	}
}

// checkPodAddr checks that addr is NAME-i.SERVICE.NAMESPACE.svc:PORT of a
// StatefulSet among allocs (i < its replicas) and its gRPC port.
func checkPodAddr(addr string, allocs []*workload) error {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(p)
	for _, w := range allocs {
		for i := range int(w.replicas) {
			if host == fmt.Sprintf("%s-%d.%s.%s.svc", w.name, i, w.serviceName, w.namespace) {
				if port != w.servers[0].grpcPort {
					return fmt.Errorf("%s: port %d, the allocator's gRPC listens on %d", addr, port, w.servers[0].grpcPort)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("%s names no allocator pod", addr)
}

// selectWorkloads is the workloads of namespace whose pods sel selects.
func selectWorkloads(t *testing.T, what string, workloads []*workload, namespace string, sel *metav1.LabelSelector) []*workload {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return nil
	}
	var out []*workload
	for _, w := range workloads {
		if w.namespace == namespace && s.Matches(labels.Set(w.labels)) {
			out = append(out, w)
		}
	}
	return out
}

func checkSelector(t *testing.T, where string, sel *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || !s.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: the selector does not match the pod template's labels (%v)", where, err)
	}
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestDockerfileBuildsRealPackages: the image's go build commands name
// main packages of this module, with cgo off, and the image runs as a
// user other than root.
func TestDockerfileBuildsRealPackages(t *testing.T) {
	b, err := os.ReadFile("../../deploy/docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	builds := regexp.MustCompile(`(?:^|&&|;|RUN)\s*((?:\w+=\S+\s+)*)go build ([^&;\n]*)`).FindAllStringSubmatch(text, -1)
	if len(builds) == 0 {
		t.Fatal("no go build in the Dockerfile")
	}
	built := map[string]bool{}
	for _, m := range builds {
		if !strings.Contains(m[1], "CGO_ENABLED=0") {
			t.Errorf("go build %s: without CGO_ENABLED=0 the binary is not static", m[2])
		}
		var pkgs []string
		for _, f := range strings.Fields(m[2]) {
			if strings.HasPrefix(f, "./") {
				pkgs = append(pkgs, f)
			}
		}
		if len(pkgs) == 0 {
			t.Errorf("go build %s: names no package", m[2])
		}
		for _, p := range pkgs {
			bp, err := build.ImportDir(filepath.Join("../..", p), 0)
			if err != nil || bp.Name != "main" {
				t.Errorf("go build %s: %s is not a main package of this module: %v", m[2], p, err)
			}
			built[filepath.Base(p)] = true
		}
	}
	if !built["leasehold"] {
		t.Error("the image does not build ./cmd/leasehold")
	}
	stages := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(text, -1)
	if len(stages) < 2 || stages[len(stages)-1][1] != "scratch" {
		t.Errorf("the final stage is %v, want a scratch image holding the static binaries", stages)
	}
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(text, -1)
	if len(users) == 0 {
		t.Fatal("no USER: the image would run as root")
	}
	if u := strings.Split(users[len(users)-1][1], ":")[0]; u == "0" || u == "root" {
		t.Errorf("USER %s: the image runs as root", u)
	}
	if !strings.Contains(text, `ENTRYPOINT ["/leasehold"]`) {
		t.Error(`no ENTRYPOINT ["/leasehold"]: the manifests' args start with the command`)
	}
}
