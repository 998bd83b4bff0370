# The pre-delete hook: deletes the chart's two webhook configurations before Helm removes the
# Service and the Deployment, so no admission is ever sent to a service that is going away.
# Standard library only (the service's image has no kubectl); runs as the hook's own account.
import os
import ssl
import sys
import urllib.error
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
host = f"[{host}]" if ":" in host else host
api = os.environ.get("API_SERVER") or f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
with open(os.environ.get("TOKEN_FILE", f"{ACCOUNT}/token"), encoding="utf-8") as handle:
    token = handle.read().strip()
context = None
if api.startswith("https:"):
    context = ssl.create_default_context(cafile=os.environ.get("CA_FILE", f"{ACCOUNT}/ca.crt"))
name = os.environ["CONFIGURATION"]
failed = False
# Validation first, as Helm 4 orders them: mutation alone never blocks a removal.
for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
    url = f"{api}/apis/admissionregistration.k8s.io/v1/{plural}/{name}"
    request = urllib.request.Request(
        url,
        method="DELETE",
        data=b'{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10):
            print(f"deleted {plural}/{name}")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            print(f"{plural}/{name} is already gone")
            continue
        body = err.read()[:300].decode(errors="replace")
        print(f"error: cannot delete {plural}/{name}: HTTP {err.code}: {body}", file=sys.stderr)
        failed = True
    except OSError as err:
        print(f"error: cannot reach the API server at {api}: {err}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
