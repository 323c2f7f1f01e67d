"""Objects in S3-compatible storage: ``s3://bucket/key`` paths, the client (boto3, the
optional ``s3`` extra), an object's identity and ranged reads, each failure raised as a
``RecordIOError`` that names the URL.

The endpoint, credentials and region come from boto3's own resolution: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/config`` and the
rest. Connection failures and throttling are retried with backoff by botocore (its
``standard`` retry mode); what is left after that is an error.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, NamedTuple, Tuple

from .._errors import RecordIOError
from .._extras import missing_extra

_PREFIX = "s3://"
# What picks the client: boto3's own variables, and shardloader's three for botocore's
# retries (attempts in all, with exponential backoff between them) and how long a connection
# and a read may take, which together bound how long a dead server is waited for.
_SETTINGS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "SHARDLOADER_S3_ATTEMPTS",
    "SHARDLOADER_S3_CONNECT_TIMEOUT",
    "SHARDLOADER_S3_READ_TIMEOUT",
)


def _attempts() -> int:
    return int(os.environ.get("SHARDLOADER_S3_ATTEMPTS", "4"))


def is_s3(path: str) -> bool:
    """Whether ``path`` names an object in S3-compatible storage."""
    return path.startswith(_PREFIX)


def split_url(url: str) -> Tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``."""
    bucket, _, key = url[len(_PREFIX) :].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise ValueError(f"expected an object URL s3://bucket/key, got {url!r}")
    return bucket, key


class ObjectInfo(NamedTuple):
    """What identifies one version of an object: a changed object differs in one of these."""

    bucket: str
    key: str
    size: int
    etag: str
    modified: str


# One client per process and settings: boto3's clients are thread-safe but must not cross a
# fork, and a changed variable (another endpoint, other credentials) needs a new one.
_CLIENTS: Dict[Tuple, Any] = {}
_CLIENT_LOCK = threading.Lock()


def _client() -> Any:
    pid = (os.getpid(),) + tuple(os.environ.get(name) for name in _SETTINGS)
    client = _CLIENTS.get(pid)
    if client is not None:
        return client
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise missing_extra("s3", "reading s3:// paths (boto3)") from None
    with _CLIENT_LOCK:
        client = _CLIENTS.get(pid)
        if client is None:
            config = Config(
                retries={"max_attempts": _attempts(), "mode": "standard"},
                connect_timeout=float(os.environ.get("SHARDLOADER_S3_CONNECT_TIMEOUT", "5")),
                read_timeout=float(os.environ.get("SHARDLOADER_S3_READ_TIMEOUT", "30")),
                max_pool_connections=16,
            )
            client = boto3.session.Session().client("s3", config=config)
            # A forked child's copies of the parent's clients are dropped (closing them would
            # close the parent's connections); a client for settings that changed is closed.
            for key in list(_CLIENTS):
                stale = _CLIENTS.pop(key)
                if key[0] == pid[0]:
                    stale.close()
            _CLIENTS[pid] = client
    return client


def close_clients() -> None:
    """Close this process's clients and their pooled connections; the next read opens a new
    one."""
    with _CLIENT_LOCK:
        for key in list(_CLIENTS):
            client = _CLIENTS.pop(key)
            if key[0] == os.getpid():
                client.close()


def _endpoint() -> str:
    try:
        return str(_client().meta.endpoint_url)
    except Exception:  # pragma: no cover - only for the message
        return "the endpoint"


def _failure(url: str, exc: BaseException, what: str) -> RecordIOError:
    """A ``RecordIOError`` naming ``url`` and saying what to do about ``exc``."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        reason = "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    elif isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",):
            reason = "the bucket does not exist"
        elif code in ("NoSuchKey", "404", "NotFound"):
            reason = "no such object (or no such bucket)"
        elif code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            reason = (
                f"access denied ({code}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
                f"AWS_PROFILE, and that they may read this object"
            )
        elif code in ("PreconditionFailed", "412"):
            reason = "the object changed while it was being read; start the epoch again"
        elif code in ("InvalidRange", "416"):
            reason = "the object is shorter than when it was opened; it was truncated"
        else:
            reason = f"the server answered {status} {code}: {error.get('Message', '')}".strip()
    else:
        reason = (
            f"cannot reach the server at {_endpoint()} after {_attempts()} attempts "
            f"({type(exc).__name__}: {exc}); check AWS_ENDPOINT_URL and that the server is up"
        )
    return RecordIOError(f"{url}: {what}: {reason}", path=url)


def stat_object(url: str) -> ObjectInfo:
    """The identity of the object at ``url`` (one HEAD request)."""
    bucket, key = split_url(url)
    client = _client()
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise _failure(url, exc, "cannot open the object") from exc
    return ObjectInfo(
        bucket,
        key,
        int(head["ContentLength"]),
        str(head.get("ETag", "")).strip('"'),
        str(head.get("LastModified", "")),
    )


def exists(url: str) -> bool:
    """Whether the object at ``url`` exists; other failures raise."""
    from botocore.exceptions import ClientError

    bucket, key = split_url(url)
    try:
        _client().head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise _failure(url, exc, "cannot open the object") from exc
    except Exception as exc:
        raise _failure(url, exc, "cannot open the object") from exc
    return True


def read_object(url: str) -> bytes:
    """The whole object at ``url`` (an ``.idx``)."""
    bucket, key = split_url(url)
    try:
        return bytes(_client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception as exc:
        raise _failure(url, exc, "cannot read the object") from exc


def read_range(info: ObjectInfo, start: int, stop: int, counter: Any = None) -> bytes:
    """Bytes ``[start, stop)`` of the object version ``info``, in one ranged GET; an error if
    the object changed since ``info`` or returned fewer bytes."""
    url = f"{_PREFIX}{info.bucket}/{info.key}"
    what = f"cannot read bytes {start}-{stop - 1}"
    extra = {"IfMatch": f'"{info.etag}"'} if info.etag else {}
    try:
        answer = _client().get_object(
            Bucket=info.bucket, Key=info.key, Range=f"bytes={start}-{stop - 1}", **extra
        )
        data = bytes(answer["Body"].read())
    except Exception as exc:
        raise _failure(url, exc, what) from exc
    if counter is not None:
        counter(start, stop)
    if len(data) != stop - start:
        raise RecordIOError(
            f"{url}: {what}: the server returned {len(data)} bytes, expected {stop - start}; "
            f"the object was truncated or replaced",
            path=url,
        )
    return data
