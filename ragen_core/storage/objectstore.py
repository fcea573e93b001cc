"""An object store as the lake's home: ``s3://bucket/prefix`` parsed, and the few operations the lake needs from it,
each one call of boto3 (the maintained S3 client) whose failure is a :class:`StoreError` of one line.

The operations are those an object store gives in place of POSIX renames: a put that creates a key only when it is
absent (``If-None-Match: *``), a put or delete that happens only while a key still holds what was read
(``If-Match: <etag>``), a server-side copy, and listings. Where the store is and who may use it come from boto3's
own sources only (``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and the files ``~/.aws/config`` and ``~/.aws/credentials``): never from a
data root URL, a config or anything stored in the lake, and no error message carries a credential
(:func:`redacted`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ragen_core.storage.files import LakeError

SCHEME = "s3://"
# S3's bucket rule (3-63 lower-case letters, digits, '.', '-'; a letter or digit at each end)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,200}")
_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
SINGLE_PUT_BYTES = 256 << 20  # larger files go up in parts (boto3's managed transfer)
SINGLE_COPY_BYTES = 5 << 30  # S3's limit of one CopyObject request
CONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
MISSING = ("NoSuchKey", "404", "NotFound")


class StoreError(LakeError):
    """The object store refused or could not be reached; the message is one line without credentials."""


def is_store_url(text: str | os.PathLike[str] | None) -> bool:
    """Whether ``text`` names an object-store data root: ``s3://...`` (or ``s3:/...``, what ``pathlib`` makes of it:
    a data root given to a command as a path)."""
    return text is not None and str(text).startswith("s3:/")


@dataclass(frozen=True)
class StoreRoot:
    """A data root in a bucket: ``bucket`` and the ``prefix`` every key of the lake starts with ('' for the
    bucket's top)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, relative: str) -> str:
        """The object key of the lake path ``relative`` (POSIX form, relative to the data root)."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """The lake path (relative to the data root) of the object ``key``."""
        return key[len(self.prefix) + 1 :] if self.prefix else key


def parse_root(text: str | os.PathLike[str]) -> StoreRoot:
    """The bucket and prefix of ``s3://bucket[/prefix]``; a :class:`StoreError` saying what is wrong otherwise
    (a bucket name S3 refuses, an empty, ``.`` or ``..`` segment, characters outside letters, digits and
    ``._=-``, a query or credentials in the URL)."""
    raw = str(text)
    body = raw[len(SCHEME) :] if raw.startswith(SCHEME) else raw[len("s3:/") :]
    hint = "write it as s3://BUCKET/PREFIX (letters, digits and ._=- in each folder of the prefix)"
    if any(mark in body for mark in "@?#\\ ") or ":" in body:
        raise StoreError(f"data root {raw!r} is not an object-store path: {hint}; credentials never go in the URL")
    bucket, _, prefix = body.strip("/").partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise StoreError(f"data root {raw!r} names bucket {bucket!r}, which is not a valid S3 bucket name: {hint}")
    segments = [part for part in prefix.split("/")] if prefix else []
    for segment in segments:
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise StoreError(f"data root {raw!r} has the prefix folder {segment!r}, which the lake refuses: {hint}")
    return StoreRoot(bucket, "/".join(segments))


def redacted(text: str) -> str:
    """``text`` with every credential this process could send (from the environment and boto3's resolved
    credentials) replaced by ``***``."""
    secrets = [os.environ.get(name, "") for name in _CREDENTIAL_VARIABLES]
    secrets += list(_resolved_credentials())
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):  # an endpoint's user:password@, if any
        userinfo = urlsplit(os.environ.get(name, "")).netloc.rpartition("@")[0]
        secrets += [userinfo, *userinfo.split(":")] if userinfo else []
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return " ".join(text.split())


@functools.lru_cache(maxsize=1)
def _resolved_credentials() -> tuple[str, ...]:
    try:
        import boto3

        credentials = boto3.session.Session().get_credentials()
        if credentials is None:
            return ()
        frozen = credentials.get_frozen_credentials()
        return tuple(v for v in (frozen.access_key, frozen.secret_key, frozen.token) if v)
    except Exception:  # noqa: BLE001 - no credentials to hide when none resolve
        return ()


_clients: dict[tuple[Any, ...], Any] = {}
_clients_guard = threading.Lock()
_CLIENT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_REGION")


def _client() -> Any:
    """One boto3 S3 client per process and setting of the variables that choose the store and the credentials
    (boto3 clients are thread-safe; the session that makes them is not)."""
    key = (os.getpid(), *(os.environ.get(name) for name in _CLIENT_VARIABLES))
    with _clients_guard:
        client = _clients.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                retries={"max_attempts": 4, "mode": "standard"},
                connect_timeout=10,
                read_timeout=120,
                # no checksum trailers: S3-compatible servers (MinIO, moto, Ceph) differ in what they accept
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            client = boto3.session.Session().client("s3", config=config)
            _clients[key] = client
        return client


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    error = response.get("Error", {})
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return str(error.get("Code") or status)


@dataclass(frozen=True)
class Listed:
    """One object of a listing: its size and entity tag."""

    size: int
    etag: str


class Store:
    """The object-store operations of the lake at ``root``, keys given relative to the data root."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root

    def _fail(self, what: str, relative: str, exc: Exception) -> StoreError:
        from botocore.exceptions import NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            return StoreError(
                f"no credentials for the object store of {self.root.url}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or ~/.aws/credentials)"
            )
        code = _code(exc)
        if code == "NoSuchBucket" or (code in MISSING and what == "reach"):
            return StoreError(f"bucket {self.root.bucket!r} does not exist at the object store; create it first")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return StoreError(
                f"the object store refused to {what} {self._where(relative)} ({code}): check the credentials "
                "(AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket's permissions"
            )
        detail = redacted(f"{type(exc).__name__}: {exc}")
        return StoreError(f"cannot {what} {self._where(relative)}: {detail}")

    def _where(self, relative: str) -> str:
        return f"{self.root.url}/{relative}" if relative else self.root.url

    def _call(self, what: str, relative: str, method: str, **arguments: Any) -> Any:
        try:
            return getattr(_client(), method)(Bucket=self.root.bucket, **arguments)
        except Exception as exc:  # noqa: BLE001 - every client failure becomes one line
            raise self._fail(what, relative, exc) from None

    def check_bucket(self) -> None:
        """Refuse (one line) a bucket that is missing or that these credentials cannot reach."""
        self._call("reach", "", "head_bucket")

    def read(self, relative: str) -> tuple[bytes, str] | None:
        """The bytes and entity tag of the object at ``relative``, or None when there is none."""
        try:
            answer = _client().get_object(Bucket=self.root.bucket, Key=self.root.key(relative))
            return answer["Body"].read(), answer["ETag"]
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in MISSING:
                return None
            raise self._fail("read", relative, exc) from None

    def write(self, relative: str, data: bytes) -> str:
        """Put ``data`` at ``relative`` whatever it held; its new entity tag."""
        return self._call("write", relative, "put_object", Key=self.root.key(relative), Body=data)["ETag"]

    def create(self, relative: str, data: bytes) -> str | None:
        """Put ``data`` at ``relative`` only if no object is there (``If-None-Match: *``): its entity tag, or None
        when one was (another writer created it first)."""
        return self._conditional(relative, data, IfNoneMatch="*")

    def replace(self, relative: str, data: bytes, etag: str) -> str | None:
        """Put ``data`` at ``relative`` only while it holds ``etag`` (``If-Match``): the new tag, or None."""
        return self._conditional(relative, data, IfMatch=etag)

    def _conditional(self, relative: str, data: bytes, **condition: str) -> str | None:
        """A conditional put: its tag, or None when the condition failed. A put that failed its condition is read
        back: holding exactly ``data`` (which the lake's callers make unique), it was this put's own, whose answer
        was lost and whose retry met it. A conflict with another conditional put in flight is tried again."""
        for attempt in range(6):
            try:
                key = self.root.key(relative)
                return _client().put_object(Bucket=self.root.bucket, Key=key, Body=data, **condition)["ETag"]
            except Exception as exc:  # noqa: BLE001
                code = _code(exc)
                if code in ("ConditionalRequestConflict", "409") and attempt < 5:
                    time.sleep(0.1 * 2**attempt)
                    continue
                if code not in CONDITION_FAILED and not (code in MISSING and "IfMatch" in condition):
                    raise self._fail("write", relative, exc) from None
            current = self.read(relative)
            return current[1] if current is not None and current[0] == data else None
        return None

    def remove(self, relative: str, etag: str | None = None) -> bool:
        """Delete the object at ``relative`` (only while it holds ``etag``, when given); False when the condition
        failed."""
        condition = {"IfMatch": etag} if etag else {}
        try:
            _client().delete_object(Bucket=self.root.bucket, Key=self.root.key(relative), **condition)
            return True
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in CONDITION_FAILED or _code(exc) in MISSING:
                return False
            raise self._fail("delete", relative, exc) from None

    def copy(self, source: str, target: str, size: int = 0) -> str:
        """Copy ``source`` (of ``size`` bytes) to ``target`` inside the bucket (server side); the target's entity
        tag. One request up to S3's 5 GiB, in parts above."""
        where = {"Bucket": self.root.bucket, "Key": self.root.key(source)}
        if size <= SINGLE_COPY_BYTES:
            answer = self._call("copy", target, "copy_object", Key=self.root.key(target), CopySource=where)
            return answer["CopyObjectResult"]["ETag"]
        self._managed("copy", target, lambda client: client.copy(where, self.root.bucket, self.root.key(target)))
        return self._call("read", target, "head_object", Key=self.root.key(target))["ETag"]

    def upload(self, path: Path, relative: str) -> str:
        """Put the local file ``path`` at ``relative``; its entity tag (one request up to :data:`SINGLE_PUT_BYTES`;
        a larger checkpoint shard in parts, by boto3's managed transfer)."""
        if path.stat().st_size <= SINGLE_PUT_BYTES:
            with open(path, "rb") as handle:
                return self._call("upload", relative, "put_object", Key=self.root.key(relative), Body=handle)["ETag"]
        key = self.root.key(relative)
        self._managed("upload", relative, lambda client: client.upload_file(str(path), self.root.bucket, key))
        return self._call("read", relative, "head_object", Key=key)["ETag"]

    def _managed(self, what: str, relative: str, transfer: Any) -> None:
        try:
            transfer(_client())
        except Exception as exc:  # noqa: BLE001 - every client failure becomes one line
            raise self._fail(what, relative, exc) from None

    def download(self, relative: str, path: Path) -> str | None:
        """Write the object at ``relative`` to ``path`` (through a temporary file and a rename, so a reader never
        sees half of it); its entity tag, or None when it is gone."""
        try:
            answer = _client().get_object(Bucket=self.root.bucket, Key=self.root.key(relative))
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in MISSING:
                return None
            raise self._fail("read", relative, exc) from None
        temporary = path.with_name(f".{path.name}.download-{uuid.uuid4().hex[:12]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as handle:
                for chunk in answer["Body"].iter_chunks(1 << 20):
                    handle.write(chunk)
            os.replace(temporary, path)
        except OSError as exc:  # a folder where the object's file goes, or the other way round; a full disk
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise StoreError(f"cannot write {self._where(relative)} to {str(path)!r}: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001 - the connection broke during the transfer
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise self._fail("read", relative, exc) from None
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise
        return answer["ETag"]

    def listing(self, relative_prefix: str = "") -> dict[str, Listed]:
        """Every object under ``relative_prefix`` (a folder of the lake, '' for all): lake path -> size and tag."""
        return dict(self._walk(relative_prefix))

    def _walk(self, relative_prefix: str) -> Iterator[tuple[str, Listed]]:
        prefix = (
            self.root.key(relative_prefix) if relative_prefix else (f"{self.root.prefix}/" if self.root.prefix else "")
        )
        token: dict[str, str] = {}
        while True:
            page = self._call("list", relative_prefix, "list_objects_v2", Prefix=prefix, **token)
            for item in page.get("Contents", []):
                yield self.root.relative(item["Key"]), Listed(int(item["Size"]), item["ETag"])
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}
