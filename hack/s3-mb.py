#!/usr/bin/env python3
"""Creates a bucket on an S3 endpoint with one SigV4-signed PUT (no client to install).

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... hack/s3-mb.py ENDPOINT BUCKET
An existing bucket is fine.
"""
import datetime
import hashlib
import hmac
import os
import sys
import urllib.error
import urllib.request

endpoint, bucket = sys.argv[1].rstrip("/"), sys.argv[2]
access, secret, region = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"], "us-east-1"
host = endpoint.split("://", 1)[1]
now = datetime.datetime.now(datetime.timezone.utc)
amz_date, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
payload = hashlib.sha256(b"").hexdigest()
canonical = (
    f"PUT\n/{bucket}\n\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n\n"
    f"host;x-amz-content-sha256;x-amz-date\n{payload}"
)
scope = f"{date}/{region}/s3/aws4_request"
to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
key = ("AWS4" + secret).encode()
for part in (date, region, "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
request = urllib.request.Request(
    f"{endpoint}/{bucket}",
    method="PUT",
    headers={
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
        f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}",
    },
)
try:
    urllib.request.urlopen(request)
except urllib.error.HTTPError as error:
    if error.code != 409:
        sys.exit(f"creating bucket {bucket}: HTTP {error.code} {error.read().decode(errors='replace')}")
