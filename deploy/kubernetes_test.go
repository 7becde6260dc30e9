// Package deploy_test checks the deployment files as shipped: the
// Kubernetes manifests decode strictly into the API's types and run each
// component hardened, with its secrets mounted as files; the systemd units
// are hardened and take their secrets as credentials; and every flag and
// BATON_* variable that either sets is one the binary reads.
package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// kinds are the API types a manifest may hold. A Secret is not among them:
// secrets are made from files at deployment, never written in a manifest.
var kinds = map[string]func() any{
	"v1/Namespace":                       func() any { return &corev1.Namespace{} },
	"v1/Service":                         func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                 func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                       func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":      func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
}

// manifest is one document of a manifest file, decoded.
type manifest struct {
	file string
	kind string
	obj  any
}

func (m manifest) String() string { return m.file + ": " + m.kind }

// decodeManifests decodes every document of the manifest files in dir
// strictly: an unknown or misspelt field, a duplicate key or a kind not
// in kinds is an error.
func decodeManifests(dir string) ([]manifest, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []manifest
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitDocuments(b) {
			m, err := decodeManifest(doc)
			if err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", filepath.Base(f), i+1, err)
			}
			m.file = filepath.Base(f)
			out = append(out, m)
		}
	}
	return out, nil
}

func decodeManifest(doc []byte) (manifest, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return manifest{}, err
	}
	kind := tm.APIVersion + "/" + tm.Kind
	newObj, ok := kinds[kind]
	if !ok {
		return manifest{}, fmt.Errorf("kind %q is not one Baton ships (a Secret is made from files, never written here)", kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return manifest{}, fmt.Errorf("%s: %w", kind, err)
	}
	return manifest{kind: kind, obj: obj}, nil
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents that hold only comments.
func splitDocuments(b []byte) [][]byte {
	var out [][]byte
	for _, doc := range bytes.Split(append([]byte("\n"), b...), []byte("\n---\n")) {
		for _, line := range strings.Split(string(doc), "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				out = append(out, doc)
				break
			}
		}
	}
	return out
}

// kustomization is the part of kustomization.yaml Baton uses.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// podOf returns the pod template of a Deployment or a Job.
func podOf(m manifest) (*corev1.PodTemplateSpec, string, bool) {
	switch o := m.obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template, o.Name, true
	case *batchv1.Job:
		return &o.Spec.Template, o.Name, true
	}
	return nil, "", false
}

// TestManifestsDecodeStrictlyIntoTheKubernetesTypes: every document of
// deploy/kubernetes is one of the API's types with no field it does not
// know, and kustomization.yaml lists every manifest file; a misspelt field
// is refused.
func TestManifestsDecodeStrictlyIntoTheKubernetesTypes(t *testing.T) {
	t.Parallel()
	ms, err := decodeManifests("kubernetes")
	require.NoError(t, err)
	require.NotEmpty(t, ms)

	var k kustomization
	b, err := os.ReadFile("kubernetes/kustomization.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(b, &k), "kustomization.yaml")
	require.Equal(t, "Kustomization", k.Kind)
	var files []string
	for _, m := range ms {
		if !slices.Contains(files, m.file) {
			files = append(files, m.file)
		}
	}
	slices.Sort(files)
	listed := slices.Clone(k.Resources)
	slices.Sort(listed)
	require.Equal(t, files, listed, "kustomization.yaml lists every manifest file, and only those")
	for _, m := range ms {
		if pod, name, ok := podOf(m); ok {
			for _, c := range pod.Spec.Containers {
				require.Equal(t, k.Images[0].Name, c.Image, "%s: container %s runs the image kustomization.yaml sets", name, c.Name)
			}
		}
	}

	_, err = decodeManifest([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n"))
	require.ErrorContains(t, err, `unknown field "replica"`, "strict decoding refuses a misspelt field")
	_, err = decodeManifest([]byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\nstringData:\n  k: v\n"))
	require.ErrorContains(t, err, "a Secret is made from files")
}

// TestManifestsRunEachComponentHardenedWithSecretsAsFiles: every pod runs
// as a non-root user on a read-only root file system with no capability
// and no service account token; every secret reaches it as a file of a
// mounted Secret named by a BATON_*_FILE variable (or the seed's path),
// never as a value; the API is probed on /healthz and /readyz; two relays
// run; every Deployment has a disruption budget and every pod a network
// policy.
func TestManifestsRunEachComponentHardenedWithSecretsAsFiles(t *testing.T) {
	t.Parallel()
	ms, err := decodeManifests("kubernetes")
	require.NoError(t, err)
	var pdbs []*policyv1.PodDisruptionBudget
	var policies []*networkingv1.NetworkPolicy
	var services []*corev1.Service
	for _, m := range ms {
		switch o := m.obj.(type) {
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
		case *networkingv1.NetworkPolicy:
			policies = append(policies, o)
		case *corev1.Service:
			services = append(services, o)
		}
	}
	components := map[string]bool{}
	for _, m := range ms {
		pod, name, ok := podOf(m)
		if !ok {
			continue
		}
		spec := pod.Spec
		components[pod.Labels["app.kubernetes.io/component"]] = true
		require.NotNil(t, spec.AutomountServiceAccountToken, name)
		require.False(t, *spec.AutomountServiceAccountToken, "%s: no service account token", name)
		require.NotNil(t, spec.SecurityContext.RunAsNonRoot, name)
		require.True(t, *spec.SecurityContext.RunAsNonRoot, "%s runs as a non-root user", name)
		require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, spec.SecurityContext.SeccompProfile.Type, name)

		mounted := map[string]string{} // mount path -> volume
		secretVolumes := map[string]bool{}
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				secretVolumes[v.Name] = true
				require.NotEmpty(t, v.Secret.SecretName, "%s: volume %s references a Secret", name, v.Name)
			}
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			require.NotNil(t, sc, "%s/%s has a security context", name, c.Name)
			require.False(t, *sc.AllowPrivilegeEscalation, "%s/%s", name, c.Name)
			require.True(t, *sc.ReadOnlyRootFilesystem, "%s/%s", name, c.Name)
			require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "%s/%s drops every capability", name, c.Name)
			for _, vm := range c.VolumeMounts {
				mounted[vm.MountPath] = vm.Name
			}
			for _, e := range c.Env {
				require.Nil(t, e.ValueFrom, "%s/%s: %s comes from a file, not from a Secret's value in the environment", name, c.Name, e.Name)
				require.NotContains(t, secretVariables, e.Name, "%s/%s sets the secret %s as a value: set %s_FILE to a mounted file", name, c.Name, e.Name, e.Name)
				if e.Name == "BATON_NATS_URL" {
					require.NotContains(t, e.Value, "@", "%s/%s: a NATS URL with a password is a secret: mount it and set BATON_NATS_URL_FILE", name, c.Name)
				}
				if strings.HasSuffix(e.Name, "_FILE") || e.Name == "BATON_NATS_NKEY_SEED" {
					vol := mounted[filepath.Dir(e.Value)]
					require.True(t, secretVolumes[vol], "%s/%s: %s=%s is a file of a mounted Secret", name, c.Name, e.Name, e.Value)
				}
			}
			for _, a := range c.Args {
				for _, s := range []string{"--database-url", "--model-api-key", "--webhook-secret"} {
					require.False(t, strings.HasPrefix(a, s), "%s/%s gives a secret on the command line: %s", name, c.Name, a)
				}
			}
		}
		if d, ok := m.obj.(*appsv1.Deployment); ok {
			covered := false
			for _, p := range pdbs {
				s, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
				require.NoError(t, err)
				covered = covered || s.Matches(labels.Set(pod.Labels))
			}
			require.True(t, covered, "%s has a PodDisruptionBudget", name)
			isolated := false
			for _, p := range policies {
				s, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
				require.NoError(t, err)
				isolated = isolated || (s.Matches(labels.Set(pod.Labels)) && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) && len(p.Spec.Egress) == 0)
			}
			require.True(t, isolated, "%s: a network policy denies what is not allowed", name)
			switch pod.Labels["app.kubernetes.io/component"] {
			case "relay":
				require.Equal(t, int32(2), *d.Spec.Replicas, "two relays: one streams, one stands by")
			case "api", "console":
				c := spec.Containers[0]
				require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
				require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
				require.Equal(t, c.Ports[0].Name, c.ReadinessProbe.HTTPGet.Port.String(), "the probes use the %s's port", name)
				var selecting []*corev1.Service
				for _, svc := range services {
					if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
						selecting = append(selecting, svc)
					}
				}
				require.Len(t, selecting, 1, "one Service selects the pods of %s", name)
				require.Equal(t, c.Ports[0].Name, selecting[0].Spec.Ports[0].TargetPort.String(), "the Service sends to the port of %s", name)
				if pod.Labels["app.kubernetes.io/component"] == "console" {
					require.Contains(t, []corev1.ServiceType{"", corev1.ServiceTypeClusterIP}, selecting[0].Spec.Type, "the console stays on the cluster's network")
				}
			}
		}
	}
	for _, c := range []string{"migrate", "api", "console", "relay", "worker", "group-audit", "group-webhook"} {
		require.True(t, components[c], "deploy/kubernetes runs %s", c)
	}
}

// TestNATSValuesSetThreeNodesJetStreamTLSAndBatonsAccounts reads the
// values file of the NATS chart: three nodes with JetStream, TLS on the
// client port and on routes (with certificates both ways), the CA, and
// deploy/nats/accounts.conf included.
func TestNATSValuesSetThreeNodesJetStreamTLSAndBatonsAccounts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("kubernetes/nats/values.yaml")
	require.NoError(t, err)
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
				TLS      struct {
					Enabled    bool           `json:"enabled"`
					SecretName string         `json:"secretName"`
					Merge      map[string]any `json:"merge"`
				} `json:"tls"`
			} `json:"cluster"`
			JetStream struct {
				Enabled bool `json:"enabled"`
			} `json:"jetstream"`
			NATS struct {
				TLS struct {
					Enabled    bool   `json:"enabled"`
					SecretName string `json:"secretName"`
				} `json:"tls"`
			} `json:"nats"`
			Merge map[string]any `json:"merge"`
		} `json:"config"`
		TLSCA struct {
			Enabled    bool   `json:"enabled"`
			SecretName string `json:"secretName"`
		} `json:"tlsCA"`
	}
	require.NoError(t, yaml.Unmarshal(b, &v))
	c := v.Config
	require.True(t, c.Cluster.Enabled)
	require.Equal(t, 3, c.Cluster.Replicas)
	require.True(t, c.JetStream.Enabled)
	require.True(t, c.Cluster.TLS.Enabled && c.Cluster.TLS.SecretName != "")
	require.Equal(t, true, c.Cluster.TLS.Merge["verify"], "routes present certificates both ways")
	require.True(t, c.NATS.TLS.Enabled && c.NATS.TLS.SecretName != "")
	require.True(t, v.TLSCA.Enabled && v.TLSCA.SecretName != "")
	require.Equal(t, "../nats-baton/accounts.conf", c.Merge["$include"])
	require.Contains(t, string(b), "name: nats-baton-accounts")
	require.Contains(t, string(b), "name: nats-baton-nkeys")
}
