package kubernetes_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"transferconsumer/config"
)

// The manifests in this directory are checked here, without a cluster: each
// document decoded strictly into the API type of its kind, then what the
// service needs of them (its variables, replicas, shutdown, probes, user,
// secrets, memory). TestKubernetesChecksCatchMistakes breaks them on
// purpose, one mistake at a time, and fails unless the checks notice.

const (
	manifestDir = "."

	// shutdownMargin is what the process may still take after
	// SHUTDOWN_TIMEOUT: leaving a worker stuck in the database behind
	// (5 s, consumer/service.go), flushing traces (5 s, main.go) and
	// stopping the HTTP server (5 s, observe/http.go).
	shutdownMargin = 15 * time.Second

	// measuredRSS is the service's peak RSS at 32 queues, BATCH_MAX=1
	// (BENCHMARKS.md, "Against the targets").
	measuredRSS = 33 << 20
	// brokerMaxMessage is RabbitMQ 4.x's default max_message_size: the
	// client receives a body whole, however large, before MAX_BODY_BYTES
	// can refuse it (README, MAX_BODY_BYTES).
	brokerMaxMessage = 16 << 20

	podIndexField = "metadata.labels['apps.kubernetes.io/pod-index']"
)

// imageUsers maps a user name in the Dockerfile's USER to its uid in the
// image: distroless's /etc/passwd has nonroot as 65532.
var imageUsers = map[string]int64{"nonroot": 65532}

// kustomization is the part of kustomize's file the base uses; a field
// added there must be added here, or strict decoding refuses it.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

var manifestKinds = map[string]func() any{
	"apps/v1 StatefulSet":                           func() any { return new(appsv1.StatefulSet) },
	"batch/v1 CronJob":                              func() any { return new(batchv1.CronJob) },
	"v1 Service":                                    func() any { return new(corev1.Service) },
	"policy/v1 PodDisruptionBudget":                 func() any { return new(policyv1.PodDisruptionBudget) },
	"kustomize.config.k8s.io/v1beta1 Kustomization": func() any { return new(kustomization) },
}

func TestKubernetesManifests(t *testing.T) {
	for _, err := range checkManifests(readManifests(t)) {
		t.Error(err)
	}
}

func TestKubernetesChecksCatchMistakes(t *testing.T) {
	const sts, pdb = "statefulset.yaml", "poddisruptionbudget.yaml"
	tests := []struct{ name, file, old, new, want string }{
		{"misspelt field", sts, "terminationGracePeriodSeconds: 45", "terminationGracePeriod: 45", "unknown field"},
		{"field in the wrong case", sts, "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", "unknown field"},
		{"number for a string", sts, `value: "8"`, `value: 8`, "cannot unmarshal number"},
		{"duplicate key", sts, "  replicas: 2\n", "  replicas: 2\n  replicas: 2\n", "already set"},
		{"second document", "service.yaml", "targetPort: http\n", "targetPort: http\n---\napiVersion: v1\nkind: ConfigMap\n", `unknown kind "ConfigMap"`},
		{"unknown kind", pdb, "kind: PodDisruptionBudget", "kind: DisruptionBudget", "unknown kind"},
		{"old API version", pdb, "apiVersion: policy/v1", "apiVersion: policy/v1beta1", "unknown kind"},
		{"unknown variable", sts, "name: QUEUE_COUNT", "name: QUEUE_COUNTS", "QUEUE_COUNTS"},
		{"replicas without REPLICA_COUNT", sts, "replicas: 2", "replicas: 3", "REPLICA_COUNT"},
		{"index from the name", sts, podIndexField, "metadata.name", "REPLICA_INDEX"},
		{"grace too short", sts, "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 35", "SHUTDOWN_TIMEOUT"},
		{"timeout not a duration", sts, "value: 30s", "value: thirty", "SHUTDOWN_TIMEOUT"},
		{"readiness on /healthz", sts, "path: /readyz", "path: /healthz", "/readyz"},
		{"probe on another port", sts, `value: ":8080"`, `value: ":9090"`, "port"},
		{"root", sts, "runAsUser: 65532", "runAsUser: 0", "Dockerfile"},
		{"escalation", sts, "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation"},
		{"writable root", sts, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem"},
		{"capabilities kept", sts, `drop: ["ALL"]`, `drop: ["NET_RAW"]`, "capabilities"},
		{"no seccomp", sts, "type: RuntimeDefault", "type: Unconfined", "seccomp"},
		{"PDB selects nothing", pdb, "matchLabels:\n      app.kubernetes.io/name: transferconsumer", "matchLabels:\n      app: transferconsumer", "PodDisruptionBudget"},
		{"secret mounted elsewhere", sts, "mountPath: /etc/transferconsumer/secrets", "mountPath: /secrets", "AMQP_URL_FILE"},
		{"secret by subPath", sts, "readOnly: true\n", "readOnly: true\n              subPath: amqp-url\n", "subPath"},
		{"secret unreadable", sts, "defaultMode: 0440", "defaultMode: 0400", "cannot read"},
		{"migrating", sts, "name: MIGRATE\n              value: \"false\"", "name: MIGRATE\n              value: \"true\"", "MIGRATE"},
		{"memory limit too low", sts, "memory: 256Mi", "memory: 128Mi", "memory"},
		{"GOMEMLIMIT above the limit", sts, "value: 200MiB", "value: 300MiB", "GOMEMLIMIT"},
		{"file left out", "kustomization.yaml", "  - poddisruptionbudget.yaml\n", "", "kustomization"},
		{"migrate job gone", "kustomization.yaml", "  - cronjob.yaml\n", "", "kustomization"},
		{"migrate job weekly", "cronjob.yaml", `schedule: "17 3 * * *"`, `schedule: "17 3 * * 0"`, "daily"},
		{"migrate job counted", "cronjob.yaml", "labels:\n            app.kubernetes.io/name: transferconsumer-migrate", "labels:\n            app.kubernetes.io/name: transferconsumer", "PodDisruptionBudget"},
		{"migrate job's TTL", "cronjob.yaml", "              env:\n", "              env:\n                - name: INBOX_TTL\n                  value: 24h\n", "INBOX_TTL"},
		{"migrate job as root", "cronjob.yaml", "runAsUser: 65532", "runAsUser: 0", "Dockerfile"},
		{"migrate job serves", "cronjob.yaml", `args: ["migrate"]`, `args: ["serve"]`, "migrate"},
	}
	files := readManifests(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := bytes.Count(files[tt.file], []byte(tt.old)); n != 1 {
				t.Fatalf("%s holds %q %d times, want once: update the test", tt.file, tt.old, n)
			}
			broken := maps.Clone(files)
			broken[tt.file] = bytes.Replace(files[tt.file], []byte(tt.old), []byte(tt.new), 1)
			errs := checkManifests(broken)
			if !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), tt.want) }) {
				t.Errorf("no error mentions %q; got %v", tt.want, errs)
			}
		})
	}
}

// readManifests returns every YAML file of kubernetes/ by name.
func readManifests(t *testing.T) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(manifestDir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		if files[e.Name()], err = os.ReadFile(filepath.Join(manifestDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if len(files) == 0 {
		t.Fatalf("no YAML files in %s", manifestDir)
	}
	return files
}

// splitDocuments splits a YAML stream at its "---" lines.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	var doc []byte
	for line := range bytes.Lines(b) {
		if s := string(bytes.TrimRight(line, " \r\n")); s == "---" || strings.HasPrefix(s, "--- ") {
			docs, doc = append(docs, doc), nil
			continue
		}
		doc = append(doc, line...)
	}
	return append(docs, doc)
}

// decodeStrict decodes a YAML document into the type of into, refusing
// duplicate keys and unknown fields. sigs.k8s.io/yaml decodes with
// encoding/json, which matches field names in any case and makes a number
// a string where the type wants one; the API server does neither, so the
// document is decoded a second time as the server would: YAML to JSON
// alone, then case-sensitive strict JSON.
func decodeStrict(doc []byte, into any) error {
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		return err
	}
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, reflect.New(reflect.TypeOf(into).Elem()).Interface(),
		sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	return errors.Join(append(strict, err)...)
}

// manifests is what kubernetes/ holds, decoded.
type manifests struct {
	sts       []*appsv1.StatefulSet
	cronJobs  []*batchv1.CronJob
	services  []*corev1.Service
	pdbs      []*policyv1.PodDisruptionBudget
	kustomize []*kustomization
}

func decodeManifests(files map[string][]byte) (manifests, []error) {
	var m manifests
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(files)) {
		for i, doc := range splitDocuments(files[name]) {
			where := fmt.Sprintf("%s, document %d", name, i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			if tm == (metav1.TypeMeta{}) {
				if j, _ := yaml.YAMLToJSON(doc); string(j) == "null" {
					continue // comments alone, or nothing
				}
			}
			newObj, ok := manifestKinds[tm.APIVersion+" "+tm.Kind]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: unknown kind %q of apiVersion %q: add its API type to manifestKinds", where, tm.Kind, tm.APIVersion))
				continue
			}
			obj := newObj()
			if err := decodeStrict(doc, obj); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): %w", where, tm.Kind, err))
				continue
			}
			switch o := obj.(type) {
			case *appsv1.StatefulSet:
				m.sts = append(m.sts, o)
			case *batchv1.CronJob:
				m.cronJobs = append(m.cronJobs, o)
			case *corev1.Service:
				m.services = append(m.services, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			case *kustomization:
				m.kustomize = append(m.kustomize, o)
			}
		}
	}
	return m, errs
}

// checkManifests returns every way the files fall short; none when they
// are right.
func checkManifests(files map[string][]byte) []error {
	m, errs := decodeManifests(files)
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for _, k := range m.kustomize {
		want := slices.DeleteFunc(slices.Sorted(maps.Keys(files)), func(f string) bool { return f == "kustomization.yaml" })
		if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, want) {
			fail("kustomization.yaml lists %v, the directory holds %v", got, want)
		}
	}
	if len(m.sts) != 1 || len(m.sts[0].Spec.Template.Spec.Containers) != 1 {
		fail("want one StatefulSet with one container, got %d StatefulSets", len(m.sts))
		return errs
	}
	sts := m.sts[0]
	pod := sts.Spec.Template
	env, envErrs := checkEnv(pod.Spec.Containers[0])
	errs = append(errs, envErrs...)
	for _, check := range []func(*appsv1.StatefulSet, map[string]corev1.EnvVar) []error{
		checkReplicas, checkShutdown, checkProbes, checkSecurity, checkSecrets, checkMemory,
	} {
		errs = append(errs, check(sts, env)...)
	}

	selects := func(what string, sel *metav1.LabelSelector) {
		s, err := metav1.LabelSelectorAsSelector(sel)
		switch {
		case err != nil:
			fail("%s: selector: %v", what, err)
		case sel == nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)):
			fail("%s: selector %v does not select the pods (labels %v)", what, s, pod.Labels)
		}
	}
	selects("StatefulSet", sts.Spec.Selector)
	if len(m.pdbs) != 1 {
		fail("want one PodDisruptionBudget, got %d", len(m.pdbs))
	}
	for _, pdb := range m.pdbs {
		selects("PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector)
		if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.Type != intstr.Int || mu.IntVal < 1 {
			fail("PodDisruptionBudget %s: want maxUnavailable of at least 1 pod, got %v", pdb.Name, mu)
		}
	}
	var governing *corev1.Service
	for _, svc := range m.services {
		selects("Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
		for _, p := range svc.Spec.Ports {
			if _, err := containerPort(pod.Spec.Containers[0], p.TargetPort); err != nil {
				fail("Service %s: port %s: %v", svc.Name, p.Name, err)
			}
		}
		if svc.Name == sts.Spec.ServiceName {
			governing = svc
		}
	}
	if governing == nil || governing.Spec.ClusterIP != corev1.ClusterIPNone {
		fail("StatefulSet: serviceName %q names no headless Service here", sts.Spec.ServiceName)
	}
	errs = append(errs, checkMigrateJob(m.cronJobs, sts, env)...)
	return errs
}

// checkMigrateJob checks the owner's daily migrate (adr/0011): one CronJob
// that runs `migrate` as its own pods (no selector here picks them up),
// once a day, with the service's INBOX_TTL, a database URL from a
// secret of its own, and the service's restrictions.
func checkMigrateJob(jobs []*batchv1.CronJob, sts *appsv1.StatefulSet, svcEnv map[string]corev1.EnvVar) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(jobs) != 1 {
		fail("want one CronJob running migrate, got %d", len(jobs))
		return errs
	}
	job := jobs[0]
	pod := job.Spec.JobTemplate.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		fail("CronJob %s: want one container", job.Name)
		return errs
	}
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Args, []string{"migrate"}) || len(c.Command) > 0 {
		fail("CronJob %s: runs %v %v, want the image's entrypoint with args [migrate]", job.Name, c.Command, c.Args)
	}
	// Daily at least: minute and hour as they like, every day of every month.
	if f := strings.Fields(job.Spec.Schedule); len(f) != 5 || f[2] != "*" || f[3] != "*" || f[4] != "*" {
		fail("CronJob %s: schedule %q, runs less than daily: want * in its last three fields", job.Name, job.Spec.Schedule)
	}
	if job.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		fail("CronJob %s: concurrencyPolicy %q, want Forbid", job.Name, job.Spec.ConcurrencyPolicy)
	}
	sel, _ := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if sel != nil && sel.Matches(labels.Set(pod.Labels)) {
		fail("CronJob %s: its pods carry the service's labels %v: the PodDisruptionBudget and the Service would count them", job.Name, pod.Labels)
	}
	env, envErrs := checkEnv(c)
	errs = append(errs, envErrs...)
	if env["INBOX_TTL"].Value != svcEnv["INBOX_TTL"].Value {
		fail("CronJob %s: INBOX_TTL %q, the service's is %q: a shorter one drops claims the service still counts on", job.Name, env["INBOX_TTL"].Value, svcEnv["INBOX_TTL"].Value)
	}
	if _, ok := env["DATABASE_URL_FILE"]; !ok {
		fail("CronJob %s: no DATABASE_URL_FILE: the owner's URL comes from a secret", job.Name)
	}
	// The service's restrictions, checked by the same code.
	as := sts.DeepCopy()
	as.Spec.Template = pod
	for _, err := range checkSecurity(as, env) {
		fail("CronJob %s: %v", job.Name, err)
	}
	return errs
}

// checkEnv returns the container's variables by name, and an error for
// each the service does not know: its config's (read from the struct's
// tags), those --help documents beside them (GOGC, OpenTelemetry's), and
// GOMEMLIMIT, the Go runtime's own.
func checkEnv(c corev1.Container) (map[string]corev1.EnvVar, []error) {
	known := map[string]bool{"GOMEMLIMIT": true}
	fields := reflect.TypeFor[config.Config]()
	for i := range fields.NumField() {
		known[fields.Field(i).Tag.Get("envconfig")] = true
	}
	var help bytes.Buffer
	if err := config.PrintUsage(&help); err != nil {
		return nil, []error{err}
	}
	_, table, _ := strings.Cut(help.String(), "\nVARIABLE ")
	for _, line := range strings.Split(table, "\n")[1:] {
		if name, _, _ := strings.Cut(line, " "); name != "" {
			known[name] = true
		}
	}
	var errs []error
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if !known[e.Name] {
			errs = append(errs, fmt.Errorf("env: the service does not know %s", e.Name))
		}
		if _, dup := env[e.Name]; dup {
			errs = append(errs, fmt.Errorf("env: %s is set twice", e.Name))
		}
		env[e.Name] = e
	}
	if len(c.EnvFrom) > 0 {
		errs = append(errs, errors.New("envFrom: its names cannot be checked; list each variable"))
	}
	return env, errs
}

// setting returns a variable's value in the manifest, else the service's
// default.
func setting(env map[string]corev1.EnvVar, name string) string {
	if e, ok := env[name]; ok {
		return e.Value
	}
	fields := reflect.TypeFor[config.Config]()
	for i := range fields.NumField() {
		if f := fields.Field(i); f.Tag.Get("envconfig") == name {
			return f.Tag.Get("default")
		}
	}
	return ""
}

func checkReplicas(sts *appsv1.StatefulSet, env map[string]corev1.EnvVar) []error {
	var errs []error
	if e := env["REPLICA_INDEX"]; e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != podIndexField {
		errs = append(errs, fmt.Errorf("REPLICA_INDEX: want it from the downward API, fieldRef %s", podIndexField))
	}
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	if n, err := strconv.Atoi(env["REPLICA_COUNT"].Value); err != nil || n != int(replicas) {
		errs = append(errs, fmt.Errorf("REPLICA_COUNT %q is not replicas, %d", env["REPLICA_COUNT"].Value, replicas))
	}
	return errs
}

func checkShutdown(sts *appsv1.StatefulSet, env map[string]corev1.EnvVar) []error {
	timeout, err := time.ParseDuration(env["SHUTDOWN_TIMEOUT"].Value)
	if err != nil {
		return []error{fmt.Errorf("SHUTDOWN_TIMEOUT: set it explicitly, as a duration: %v", err)}
	}
	grace := sts.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second < timeout+shutdownMargin {
		return []error{fmt.Errorf("terminationGracePeriodSeconds must be at least SHUTDOWN_TIMEOUT (%s) + %s", timeout, shutdownMargin)}
	}
	return nil
}

func checkProbes(sts *appsv1.StatefulSet, env map[string]corev1.EnvVar) []error {
	c := sts.Spec.Template.Spec.Containers[0]
	_, port, err := net.SplitHostPort(setting(env, "HTTP_ADDR"))
	if err != nil {
		return []error{fmt.Errorf("HTTP_ADDR: %v", err)}
	}
	var errs []error
	for _, p := range []struct {
		what, path string
		probe      *corev1.Probe
	}{{"livenessProbe", "/healthz", c.LivenessProbe}, {"readinessProbe", "/readyz", c.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path {
			errs = append(errs, fmt.Errorf("%s: want an HTTP GET of %s", p.what, p.path))
			continue
		}
		if n, err := containerPort(c, p.probe.HTTPGet.Port); err != nil || strconv.Itoa(int(n)) != port {
			errs = append(errs, fmt.Errorf("%s: port %s is not HTTP_ADDR's, %s (%v)", p.what, p.probe.HTTPGet.Port.String(), port, err))
		}
	}
	return errs
}

// containerPort resolves a port by number or by the container's name for it.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, error) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("the container has no port %s", p.String())
}

func checkSecurity(sts *appsv1.StatefulSet, _ map[string]corev1.EnvVar) []error {
	spec := sts.Spec.Template.Spec
	pod, c := spec.SecurityContext, spec.Containers[0].SecurityContext
	if pod == nil || c == nil {
		return []error{errors.New("want a securityContext on the pod and on the container")}
	}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	// A container's setting overrides the pod's.
	nonRoot, user, seccomp := pod.RunAsNonRoot, pod.RunAsUser, pod.SeccompProfile
	if c.RunAsNonRoot != nil {
		nonRoot = c.RunAsNonRoot
	}
	if c.RunAsUser != nil {
		user = c.RunAsUser
	}
	if c.SeccompProfile != nil {
		seccomp = c.SeccompProfile
	}
	if nonRoot == nil || !*nonRoot {
		fail("runAsNonRoot: want true")
	}
	if want, err := dockerfileUser(); err != nil {
		fail("%v", err)
	} else if user == nil || *user != want {
		fail("runAsUser: want %d, the Dockerfile's USER", want)
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("seccompProfile: want RuntimeDefault")
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		fail("readOnlyRootFilesystem: want true")
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		fail("allowPrivilegeEscalation: want false")
	}
	if c.Privileged != nil && *c.Privileged {
		fail("privileged: want false")
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		fail("capabilities: want ALL dropped, none added")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		fail("automountServiceAccountToken: want false, the service never calls the API")
	}
	return errs
}

// dockerfileUser returns the uid the image runs as: the last USER of the
// Dockerfile, by number or through imageUsers; an error if it is root.
func dockerfileUser() (int64, error) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		return 0, err
	}
	var user string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 && strings.EqualFold(f[0], "USER") {
			user, _, _ = strings.Cut(f[1], ":")
		}
	}
	uid, err := strconv.ParseInt(user, 10, 64)
	if err != nil {
		var ok bool
		if uid, ok = imageUsers[user]; !ok {
			return 0, fmt.Errorf("Dockerfile: USER %q: add its uid to imageUsers", user)
		}
	}
	if uid == 0 {
		return 0, errors.New("Dockerfile: the image runs as root")
	}
	return uid, nil
}

// checkSecrets: the URLs come from files of a secret volume, mounted whole
// (a subPath mount is never updated, so a rotation would need a restart)
// and readable by the service's user; the service changes neither the
// schema nor the topology.
func checkSecrets(sts *appsv1.StatefulSet, env map[string]corev1.EnvVar) []error {
	spec := sts.Spec.Template.Spec
	var errs []error
	for _, name := range []string{"AMQP_URL", "DATABASE_URL"} {
		file := env[name+"_FILE"].Value
		if _, set := env[name]; set || !path.IsAbs(file) {
			errs = append(errs, fmt.Errorf("%s: want %[1]s_FILE, a path in a secret volume, and not %[1]s", name))
			continue
		}
		if err := secretFile(spec, file); err != nil {
			errs = append(errs, fmt.Errorf("%s_FILE %s: %w", name, file, err))
		}
	}
	for _, name := range []string{"MIGRATE", "DECLARE_TOPOLOGY"} {
		if on, err := strconv.ParseBool(env[name].Value); err != nil || on {
			errs = append(errs, fmt.Errorf("%s: want \"false\": the schema's owner and an admin make them", name))
		}
	}
	return errs
}

func secretFile(spec corev1.PodSpec, file string) error {
	for _, m := range spec.Containers[0].VolumeMounts {
		if path.Clean(m.MountPath) != path.Dir(file) {
			continue
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return fmt.Errorf("mounted by subPath, which a rotation never updates")
		}
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || spec.Volumes[i].Secret == nil {
			return fmt.Errorf("volume %s is not a secret", m.Name)
		}
		s := spec.Volumes[i].Secret
		mode := int32(corev1.SecretVolumeSourceDefaultMode)
		if s.DefaultMode != nil {
			mode = *s.DefaultMode
		}
		if len(s.Items) > 0 {
			j := slices.IndexFunc(s.Items, func(k corev1.KeyToPath) bool { return k.Path == path.Base(file) })
			if j < 0 {
				return fmt.Errorf("secret %s has no item with path %s", s.SecretName, path.Base(file))
			}
			if s.Items[j].Mode != nil {
				mode = *s.Items[j].Mode
			}
		}
		// The files belong to root, and to fsGroup's group when it is set.
		if mode&0o004 == 0 && (mode&0o040 == 0 || spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil) {
			return fmt.Errorf("mode %#o: the service's user cannot read it", mode)
		}
		return nil
	}
	return errors.New("no volume is mounted there")
}

// checkMemory: the limit holds the measured footprint and the worst case
// of the README's MAX_BODY_BYTES note, BATCH_MAX × QUEUE_COUNT bodies of
// the broker's largest message; GOMEMLIMIT lies between that and the limit.
func checkMemory(sts *appsv1.StatefulSet, env map[string]corev1.EnvVar) []error {
	c := sts.Spec.Template.Spec.Containers[0]
	batch, err1 := strconv.ParseInt(setting(env, "BATCH_MAX"), 10, 64)
	queues, err2 := strconv.ParseInt(setting(env, "QUEUE_COUNT"), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return []error{fmt.Errorf("BATCH_MAX, QUEUE_COUNT: %w", err)}
	}
	worst := measuredRSS + batch*queues*brokerMaxMessage
	request, limit := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	var errs []error
	if request.Value() < measuredRSS {
		errs = append(errs, fmt.Errorf("memory request %s: below the measured %d MiB", request, measuredRSS>>20))
	}
	if limit.Value() < worst {
		errs = append(errs, fmt.Errorf("memory limit %s: below the worst case, %d MiB", limit, worst>>20))
	}
	soft, err := goMemLimit(env["GOMEMLIMIT"].Value)
	switch {
	case err != nil:
		errs = append(errs, err)
	case soft < worst || soft >= limit.Value():
		errs = append(errs, fmt.Errorf("GOMEMLIMIT %s: want it between the worst case, %d MiB, and the limit, %s", env["GOMEMLIMIT"].Value, worst>>20, limit))
	}
	return errs
}

// goMemLimit reads GOMEMLIMIT as the Go runtime does: a whole number of
// bytes, with B, KiB, MiB, GiB or TiB after it.
func goMemLimit(s string) (int64, error) {
	num := strings.TrimRight(s, "BKMGTi")
	unit := map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[s[len(num):]]
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || unit == 0 {
		return 0, fmt.Errorf("GOMEMLIMIT %q: want a size in bytes, as the Go runtime reads it (e.g. 200MiB)", s)
	}
	return n * unit, nil
}
