"""Remote files on S3, against moto's S3 server on loopback: signed access (bucket and
object names, s3:// and HTTP URLs), public access, presigned URLs, kvikpy.read of
s3:// URLs, errors; and, with a moto server that checks every signature, that kvikpy's
SigV4 signatures are accepted and a wrong secret is refused."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import random_bytes

import kvikpy
from kvikpy import RemoteEndpointType, RemoteFile
from kvikpy.errors import RemoteError, RemoteNotFoundError, RemoteUrlError

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

MiB = 1 << 20
BUCKET = "kvikpy-tests"
OBJECTS = {
    "small.bin": random_bytes(1000, seed=11),
    "dir/large.bin": random_bytes(5 * MiB + 321, seed=12),
    "odd name+x.bin": random_bytes(4097, seed=13),
}
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "kvikpy_test_key",
    "AWS_SECRET_ACCESS_KEY": "kvikpy_test_secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server in a thread, the bucket and objects created, and the AWS
    variables set to reach it; yields its endpoint URL."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in CREDENTIALS.items():
            mp.setenv(name, value)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET, ACL="public-read-write")
        for key, data in OBJECTS.items():
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
        try:
            yield endpoint
        finally:
            server.stop()


def read_all(f: RemoteFile, task_size: int | None = None) -> bytes:
    buf = bytearray(f.nbytes())
    assert f.read(buf, task_size=task_size) == len(buf)
    return bytes(buf)


@pytest.mark.parametrize("key", sorted(OBJECTS))
def test_open_s3_by_bucket_and_object(s3, key):
    with RemoteFile.open_s3(BUCKET, key) as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.S3
        assert f.nbytes() == len(OBJECTS[key])
        assert read_all(f, task_size=MiB) == OBJECTS[key]


def test_open_s3_url_forms(s3):
    data = OBJECTS["small.bin"]
    with RemoteFile.open_s3_url(f"s3://{BUCKET}/small.bin") as f:
        assert read_all(f) == data
    with RemoteFile.open_s3_url(f"{s3}/{BUCKET}/small.bin") as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.S3
        assert read_all(f) == data
    with pytest.raises(ValueError, match="Unsupported protocol"):
        RemoteFile.open_s3_url(f"unknown://{BUCKET}/small.bin")


def test_arguments_override_the_environment(s3, monkeypatch):
    for name in (*CREDENTIALS, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="AWS_DEFAULT_REGION"):
        RemoteFile.open_s3(BUCKET, "small.bin")
    with pytest.raises(RemoteUrlError, match="AWS_ACCESS_KEY_ID"):
        RemoteFile.open_s3(BUCKET, "small.bin", aws_region_name="us-east-1")
    with RemoteFile.open_s3(
        BUCKET,
        "small.bin",
        aws_region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        aws_endpoint_url=s3,
    ) as f:
        assert read_all(f) == OBJECTS["small.bin"]
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN"):
        RemoteFile.open_s3(
            BUCKET,
            "small.bin",
            aws_region_name="us-east-1",
            aws_access_key_id="ASIATEMPORARY",
            aws_secret_access_key="s",
            aws_endpoint_url=s3,
        )


def test_missing_objects_and_buckets(s3):
    with pytest.raises(RuntimeError, match="URL returned error: 404") as info:
        RemoteFile.open_s3("unknown-bucket", "small.bin")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(RemoteNotFoundError, match="URL returned error: 404"):
        RemoteFile.open_s3(BUCKET, "unknown-file")


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize(("offset", "size"), [(0, 5 * MiB + 321), (1, 4096), (MiB + 7, 3 * MiB)])
def test_ranges_in_parallel(s3, threads, offset, size):
    data = OBJECTS["dir/large.bin"]
    with (
        kvikpy.defaults.set({"num_threads": threads, "task_size": MiB}),
        RemoteFile.open_s3_url(f"s3://{BUCKET}/dir/large.bin") as f,
    ):
        buf = np.zeros(size, dtype=np.uint8)
        assert f.pread(buf, file_offset=offset).get() == size
    assert buf.tobytes() == data[offset : offset + size]


def test_open_with_endpoint_types(s3):
    url = f"s3://{BUCKET}/small.bin"
    for kind in (RemoteEndpointType.AUTO, RemoteEndpointType.S3):
        for allow in (None, [RemoteEndpointType.S3]):
            for nbytes in (None, 1):
                with RemoteFile.open(url, kind, allow, nbytes) as f:
                    assert f.nbytes() == (1000 if nbytes is None else 1)
                    assert f.remote_endpoint_type() is RemoteEndpointType.S3
    assert kvikpy.infer_remote_endpoint_type(url) is RemoteEndpointType.S3
    with pytest.raises(RuntimeError, match="Unsupported endpoint URL"):
        RemoteFile.open(f"s3://{BUCKET}")
    with pytest.raises(RuntimeError, match="Invalid URL"):
        RemoteFile.open(f"s3://{BUCKET}", RemoteEndpointType.S3)


def test_auto_falls_back_on_public_access_without_credentials(s3, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    url = f"s3://{BUCKET}/small.bin"
    assert kvikpy.infer_remote_endpoint_type(url) is RemoteEndpointType.S3_PUBLIC
    with RemoteFile.open(url) as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.S3_PUBLIC
        assert read_all(f) == OBJECTS["small.bin"]


def test_public_access(s3):
    for url in (f"{s3}/{BUCKET}/odd name+x.bin", f"s3://{BUCKET}/odd name+x.bin"):
        with RemoteFile.open_s3_public(url) as f:
            assert f.remote_endpoint_type() is RemoteEndpointType.S3_PUBLIC
            assert read_all(f) == OBJECTS["odd name+x.bin"]


def test_presigned_url(s3):
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=s3, config=Config(signature_version="s3v4"))
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "dir/large.bin"}, ExpiresIn=600
    )
    assert "X-Amz-Signature" in url
    with RemoteFile.open_s3_presigned_url(url) as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.S3_PRESIGNED_URL
        assert f.nbytes() == len(OBJECTS["dir/large.bin"])
        assert read_all(f, task_size=MiB) == OBJECTS["dir/large.bin"]


def test_kvikpy_read_of_s3_urls(s3):
    buf = kvikpy.read(f"s3://{BUCKET}/dir/large.bin", device="cpu")
    assert np.from_dlpack(buf).tobytes() == OBJECTS["dir/large.bin"]
    batch = kvikpy.read_many(
        [f"s3://{BUCKET}/small.bin", f"s3://{BUCKET}/odd name+x.bin"], device="cpu"
    )
    assert (
        np.from_dlpack(batch.buffer).tobytes() == OBJECTS["small.bin"] + OBJECTS["odd name+x.bin"]
    )
    ranges = kvikpy.read_ranges(f"s3://{BUCKET}/dir/large.bin", [(5, 10), (MiB, 100)], device="cpu")
    data = OBJECTS["dir/large.bin"]
    assert np.from_dlpack(ranges.buffer).tobytes() == data[5:15] + data[MiB : MiB + 100]


def test_an_object_overwritten_after_open_is_an_error(s3):
    """Reads are pinned to the object's ETag at open (If-Match, which S3 and moto honour
    with 412): an object overwritten meanwhile is one clear error, whatever the endpoint."""
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=s3, config=Config(signature_version="s3v4"))
    old, new = OBJECTS["dir/large.bin"], random_bytes(len(OBJECTS["dir/large.bin"]), seed=14)
    key = "overwritten.bin"
    presigned = client.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=600
    )
    signature = presigned.split("X-Amz-Signature=")[1].split("&")[0]
    openers = {
        "signed": lambda: RemoteFile.open_s3(BUCKET, key),
        "public": lambda: RemoteFile.open_s3_public(f"s3://{BUCKET}/{key}"),
        "presigned": lambda: RemoteFile.open_s3_presigned_url(presigned),
    }
    for name, open_it in openers.items():
        etag = client.put_object(Bucket=BUCKET, Key=key, Body=old)["ETag"]
        with open_it() as f:
            client.put_object(Bucket=BUCKET, Key=key, Body=new)
            with pytest.raises(RemoteError) as info:
                read_all(f, task_size=MiB)
        e = info.value
        assert e.errno == errno.ESTALE, name
        text = str(e)
        assert "changed on the server since it was opened" in text, name
        assert etag in text and "412 Precondition Failed" in text, name
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in text, name
        assert signature not in text, name
        with open_it() as f:
            assert read_all(f, task_size=MiB) == new, name


@pytest.fixture(scope="module")
def checking_s3() -> Iterator[tuple[str, str, str]]:
    """A moto S3 server (its own process) that authenticates every request after the
    first four (the IAM calls that create a user allowed s3:* and its access key); yields
    its endpoint, the key id and the secret, with a bucket holding ``small.bin``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        anonymous = {"aws_access_key_id": "x", "aws_secret_access_key": "y"}
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", **anonymous)
        iam.create_user(UserName="reader")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        arn = iam.create_policy(PolicyName="s3", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
        iam.attach_user_policy(UserName="reader", PolicyArn=arn)
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        )
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="a b/small.bin", Body=OBJECTS["small.bin"])
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        server.kill()
        server.wait(timeout=10)


def test_signatures_are_checked_by_the_server(checking_s3):
    endpoint, key_id, secret = checking_s3
    options = {"aws_region_name": "us-east-1", "aws_endpoint_url": endpoint}
    with RemoteFile.open_s3(
        BUCKET, "a b/small.bin", aws_access_key_id=key_id, aws_secret_access_key=secret, **options
    ) as f:
        assert read_all(f, task_size=100) == OBJECTS["small.bin"]
    with pytest.raises(PermissionError, match="403"):
        RemoteFile.open_s3(
            BUCKET,
            "a b/small.bin",
            aws_access_key_id=key_id,
            aws_secret_access_key="wrong",
            **options,
        )
    # Unsigned requests are refused too: the object is not public.
    with pytest.raises(PermissionError):
        RemoteFile.open_s3_public(f"{endpoint}/{BUCKET}/a b/small.bin")


def test_a_safetensors_checkpoint_from_s3(s3, tmp_path):
    from test_safetensors import write_safetensors

    import kvikpy.safetensors as kst

    rng = np.random.default_rng(3)
    want = {
        "w": rng.standard_normal((64, 33)).astype(np.float32),
        "ids": np.arange(1000, dtype=np.int64),
    }
    local = tmp_path / "m.safetensors"
    write_safetensors(local, want)
    data = local.read_bytes()
    client = boto3.client("s3", endpoint_url=s3)
    client.put_object(Bucket=BUCKET, Key="ckpt/model.safetensors", Body=data)
    url = f"s3://{BUCKET}/ckpt/model.safetensors"
    assert kst.read_header(url) == kst.read_header(local)
    got = kst.load_file(url, device="cpu", framework="numpy")
    assert set(got) == set(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array)
    # An object cut inside its data section is refused by the header's checks.
    client.put_object(Bucket=BUCKET, Key="ckpt/cut.safetensors", Body=data[:-100])
    with pytest.raises(ValueError, match=r"ckpt/cut\.safetensors"):
        kst.load_file(f"s3://{BUCKET}/ckpt/cut.safetensors", device="cpu", framework="numpy")


def test_load_pretrained_from_an_s3_directory(s3, tmp_path):
    """A sharded checkpoint under an S3 prefix (as ``save_pretrained`` writes it, then
    uploaded): the index is read, then every shard, into the target."""
    from test_safetensors import write_safetensors

    import kvikpy.safetensors as kst

    rng = np.random.default_rng(5)
    want = {f"layer{i}.w": rng.standard_normal((16, 9)).astype(np.float32) for i in range(4)}
    client = boto3.client("s3", endpoint_url=s3)
    weight_map = {}
    for k, shard in enumerate(
        ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    ):
        names = list(want)[2 * k : 2 * k + 2]
        write_safetensors(tmp_path / shard, {n: want[n] for n in names})
        client.put_object(Bucket=BUCKET, Key=f"llm/{shard}", Body=(tmp_path / shard).read_bytes())
        weight_map.update(dict.fromkeys(names, shard))
    index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    client.put_object(Bucket=BUCKET, Key="llm/model.safetensors.index.json", Body=index)
    for directory in (f"s3://{BUCKET}/llm", f"s3://{BUCKET}/llm/"):
        target = {n: np.zeros_like(a) for n, a in want.items()}
        assert kst.load_pretrained(target, directory) == ([], [])
        for name, array in want.items():
            np.testing.assert_array_equal(target[name], array)
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors"):
        kst.load_pretrained({}, f"s3://{BUCKET}/no-such-model")
