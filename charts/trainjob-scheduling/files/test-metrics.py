# `helm test`: /metrics refuses a scrape without a token (401): only RBAC-authorised scrapers
# read it.
import os
import ssl
import sys
import urllib.error
import urllib.request

url = os.environ["METRICS_URL"] + "/metrics"
context = ssl.create_default_context(cafile=os.environ["CA_FILE"])
try:
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        print(f"error: an anonymous scrape was answered {answer.status}", file=sys.stderr)
        sys.exit(1)
except urllib.error.HTTPError as err:
    if err.code != 401:
        print(f"error: an anonymous scrape got {err.code}, not 401", file=sys.stderr)
        sys.exit(1)
print("an anonymous scrape of /metrics was refused (401)")
