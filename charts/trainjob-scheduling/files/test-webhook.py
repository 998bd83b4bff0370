# `helm test`: the webhooks answer a dry-run AdmissionReview through the Service, over TLS
# trusting only the service's CA (the one in every webhook's caBundle).
import json
import os
import ssl
import sys
import urllib.request
import uuid

url = os.environ["WEBHOOK_URL"] + "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
context = ssl.create_default_context(cafile=os.environ["CA_FILE"])
uid = str(uuid.uuid4())
# A runtime that sets gang.minCount, which the service always refuses: a denial proves the
# service's own rules answered, not merely something listening on the port.
runtime = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "helm-test-dry-run"},
    "spec": {
        "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}},
        "template": {"spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}
        }}]}},
    },
}
group = {"group": "trainer.kubeflow.org", "version": "v1alpha1"}
review = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": uid,
        "kind": {**group, "kind": "ClusterTrainingRuntime"},
        "resource": {**group, "resource": "clustertrainingruntimes"},
        "name": "helm-test-dry-run",
        "operation": "CREATE",
        "userInfo": {"username": "helm-test"},
        "object": runtime,
        "dryRun": True,
    },
}
request = urllib.request.Request(
    url, data=json.dumps(review).encode(), headers={"Content-Type": "application/json"}
)
with urllib.request.urlopen(request, context=context, timeout=10) as answer:
    response = json.load(answer)["response"]
message = response.get("status", {}).get("message", "")
if response.get("uid") != uid or response.get("allowed") is not False or "minCount" not in message:
    print(f"error: unexpected answer: {json.dumps(response)[:500]}", file=sys.stderr)
    sys.exit(1)
print(f"the webhook answered the dry-run review: denied as expected ({message[:200]})")
