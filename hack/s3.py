#!/usr/bin/env python3
"""A few S3 requests, SigV4-signed, with nothing to install.

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... hack/s3.py mb ENDPOINT BUCKET
        creates the bucket (an existing bucket is fine)
    ... hack/s3.py flip-byte ENDPOINT BUCKET KEY
        changes one byte in the middle of an object (to show a damaged backup refused)
    ... hack/s3.py largest ENDPOINT BUCKET PREFIX
        prints the key of the largest object under PREFIX (a repository's biggest pack)
    ... hack/s3.py du ENDPOINT BUCKET PREFIX
        prints how many objects lie under PREFIX and their bytes (a repository's packs)
    ... hack/s3.py sweep ENDPOINT REGEX
        deletes every bucket whose whole name matches REGEX, with its objects (MinIO's
        force delete: the test suite's buckets of earlier runs)
"""
import datetime
import hashlib
import hmac
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request


def request(method, endpoint, path, body=b"", headers=(), query=None):
    access, secret, region = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"], "us-east-1"
    endpoint = endpoint.rstrip("/")
    host = endpoint.split("://", 1)[1]
    path = urllib.parse.quote(path, safe="/-_.~")
    canonical_query = "&".join(
        f"{urllib.parse.quote(name, safe='-_.~')}={urllib.parse.quote(value, safe='-_.~')}"
        for name, value in sorted((query or {}).items())
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    canonical = (
        f"{method}\n{path}\n{canonical_query}\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n\n"
        f"host;x-amz-content-sha256;x-amz-date\n{payload}"
    )
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = ("AWS4" + secret).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed = urllib.request.Request(
        f"{endpoint}{path}" + (f"?{canonical_query}" if canonical_query else ""),
        data=body if method == "PUT" else None,
        method=method,
        headers={
            "x-amz-date": amz_date,
            "x-amz-content-sha256": payload,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
            f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}",
            **dict(headers),
        },
    )
    with urllib.request.urlopen(signed) as response:
        return response.read()


def objects_under(endpoint, bucket, prefix):
    """Every (key, size) under prefix."""
    objects, token = [], None
    while True:
        query = {"list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        page = request("GET", endpoint, f"/{bucket}", query=query).decode()
        objects += re.findall(r"<Key>([^<]+)</Key>.*?<Size>(\d+)</Size>", page, re.S)
        token = (re.findall(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", page) or [None])[0]
        if not token:
            return objects


def main(command, endpoint, bucket, *rest):
    if command == "mb":
        try:
            request("PUT", endpoint, f"/{bucket}")
        except urllib.error.HTTPError as error:
            if error.code != 409:
                sys.exit(f"creating bucket {bucket}: HTTP {error.code} {error.read().decode(errors='replace')}")
    elif command == "flip-byte":
        (key,) = rest
        data = bytearray(request("GET", endpoint, f"/{bucket}/{key}"))
        data[len(data) // 2] ^= 0xFF
        request("PUT", endpoint, f"/{bucket}/{key}", bytes(data))
        print(f"changed byte {len(data) // 2} of {len(data)} in s3://{bucket}/{key}")
    elif command == "largest":
        (prefix,) = rest
        objects = objects_under(endpoint, bucket, prefix)
        if not objects:
            sys.exit(f"nothing under s3://{bucket}/{prefix}")
        print(max(objects, key=lambda entry: int(entry[1]))[0])
    elif command == "du":
        (prefix,) = rest
        objects = objects_under(endpoint, bucket, prefix)
        print(len(objects), sum(int(size) for _, size in objects))
    elif command == "sweep":
        # MinIO may list a bucket again shortly after its first delete (seen here with
        # 1,400 at once): sweep until a listing shows none.
        pattern, deleted = re.compile(bucket), set()
        for _ in range(5):
            listing = request("GET", endpoint, "/").decode()
            names = [name for name in re.findall(r"<Name>([^<]+)</Name>", listing) if pattern.fullmatch(name)]
            if not names:
                break
            for name in names:
                request("DELETE", endpoint, f"/{name}", headers={"x-minio-force-delete": "true"})
            deleted.update(names)
        print(f"deleted {len(deleted)} bucket(s) matching {bucket}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(*sys.argv[1:]) if len(sys.argv) >= 4 else sys.exit(__doc__)
