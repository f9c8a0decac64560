"""Which client a request comes from (cosy.frontend.proxies, `--trusted_proxies`): `X-Forwarded-For` counts
only when the connection comes from a configured proxy, so the wrong-key limit (cosy.frontend.auth) is per
client behind HAProxy and cannot be escaped or aimed at another address with a forged header.

Real frontends (`python app.py`, tiny model, a key) and a real HAProxy; the loopback's other names
(127.0.0.2, 127.0.0.3, ...) stand for other machines: the proxy connects from 127.0.0.2, as HAProxy in its own
container does from its own address, and clients from 127.0.0.1 and 127.0.0.3."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import httpx
import pytest
from servers import free_port, start_apps

from cosy.deploy import haproxy

KEY = "fwd-Key-41c7"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROXY_SOURCE = "127.0.0.2"  # the address HAProxy connects to the frontend from
LIMIT = 30  # wrong keys a minute per address (cosy.frontend.auth.FailedAttempts)


# --- the rule alone, in process --------------------------------------------------------------------------------

def _seen_client(trusted: str, peer: str, *headers: tuple[bytes, bytes], kind: str = "http") -> tuple:
    """The (host, port) and scheme the app behind ForwardedFor sees for a connection from `peer`."""
    from cosy.frontend.proxies import ForwardedFor, parse_trusted_proxies

    seen = {}

    async def app(scope, receive, send):
        seen.update(client=scope["client"], scheme=scope["scheme"])

    scope = {"type": kind, "client": (peer, 40000), "scheme": "ws" if kind == "websocket" else "http",
             "headers": list(headers)}
    asyncio.run(ForwardedFor(app, trusted=parse_trusted_proxies(trusted))(scope, None, None))
    return seen["client"], seen["scheme"]


@pytest.mark.quick
def test_trusted_proxies_flag_values():
    from cosy.frontend.proxies import parse_trusted_proxies
    assert [str(n) for n in parse_trusted_proxies(" 127.0.0.1, 10.0.0.0/8 ,::1,")] == [
        "127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    assert parse_trusted_proxies("") == () and parse_trusted_proxies(None) == ()
    for bad in ("proxy", "10.0.0.0/33", "1.2.3.4:80"):
        with pytest.raises(ValueError, match=r"--trusted_proxies: .* is not an IP address or network"):
            parse_trusted_proxies(bad)


@pytest.mark.quick
def test_forwarded_for_counts_only_from_a_trusted_proxy():
    xff = (b"x-forwarded-for", b"203.0.113.9, 198.51.100.7")
    # from the proxy: the rightmost address it did not add itself (the client may have sent the left one)
    assert (_seen_client("10.0.0.5", "10.0.0.5", xff))[0] == ("198.51.100.7", 0)
    # the client's own header line and the one the proxy appended (HAProxy adds a line of its own)
    two = ((b"x-forwarded-for", b"203.0.113.9"), (b"x-forwarded-for", b"198.51.100.7"))
    assert (_seen_client("10.0.0.5", "10.0.0.5", *two))[0] == ("198.51.100.7", 0)
    # a chain of trusted proxies (a network): skipped from the right
    chain = (b"x-forwarded-for", b"203.0.113.9, 198.51.100.7, 10.0.0.6")
    assert (_seen_client("10.0.0.0/24", "10.0.0.5", chain))[0] == ("198.51.100.7", 0)
    # anyone else's header counts for nothing: not from another peer, not without the flag
    assert (_seen_client("10.0.0.5", "127.0.0.1", xff))[0] == ("127.0.0.1", 40000)
    assert (_seen_client("", "127.0.0.1", xff))[0] == ("127.0.0.1", 40000)
    # WebSockets too; IPv6 in brackets with a port, an IPv4-mapped peer; a proxy that names no client
    assert (_seen_client("::1", "::1", (b"x-forwarded-for", b"[2001:db8::7]:5100"), kind="websocket")) == (
        ("2001:db8::7", 0), "ws")
    assert (_seen_client("10.0.0.5", "::ffff:10.0.0.5", xff))[0] == ("198.51.100.7", 0)
    assert (_seen_client("10.0.0.5", "10.0.0.5", (b"x-forwarded-for", b" , ")))[0] == ("10.0.0.5", 40000)
    # every hop trusted: the leftmost is the client (a proxy calling for itself)
    assert (_seen_client("10.0.0.0/8", "10.0.0.5", (b"x-forwarded-for", b"10.1.1.1, 10.2.2.2")))[0] == (
        "10.1.1.1", 0)
    # the scheme the proxy was reached with, from the proxy only
    proto = (b"x-forwarded-proto", b"https")
    assert (_seen_client("10.0.0.5", "10.0.0.5", proto))[1] == "https"
    assert (_seen_client("10.0.0.5", "10.0.0.6", proto))[1] == "http"
    assert (_seen_client("10.0.0.5", "10.0.0.5", proto, kind="websocket"))[1] == "wss"


# --- real frontends ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def apps(tiny_model_dir, tmp_path_factory):
    """(trusting, plain): keyed frontends, one trusting the proxy's address and a test network, one trusting none."""
    tmp = tmp_path_factory.mktemp("forwarded")
    common = ["--model_dir", str(tiny_model_dir), "--api_key", KEY, "--max_batch", "1"]
    trusting, plain = start_apps([*common, "--data_dir", str(tmp / "a"), "--trusted_proxies",
                                  f"{PROXY_SOURCE},192.0.2.0/24"],
                                 [*common, "--data_dir", str(tmp / "b")])
    yield trusting, plain
    trusting.stop()
    plain.stop()


@pytest.fixture(scope="module")
def proxy(apps, tmp_path_factory):
    """The shipped HAProxy configuration (cosy.deploy.haproxy) in front of the trusting frontend, connecting
    to it from PROXY_SOURCE."""
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: the README's test command installs Debian's haproxy package")
    trusting = apps[0]
    port = free_port()
    cfg = haproxy.render(f"127.0.0.1:{port}", [f"127.0.0.1:{trusting.port}"], check_interval_s=0.5)
    assert "option forwardfor" in cfg  # the proxy tells the frontend who its client is
    cfg = cfg.replace("backend cosy_frontends\n", f"backend cosy_frontends\n    source {PROXY_SOURCE}\n")
    path = tmp_path_factory.mktemp("haproxy") / "haproxy.cfg"
    path.write_text(cfg)
    proc = subprocess.Popen(["haproxy", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=5).headers.get(haproxy.SERVER_HEADER) == "fe1":
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(10)


def client_from(address: str) -> httpx.Client:
    """An HTTP client whose connections come from `address` (a loopback name)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


def guess(client: httpx.Client, url: str, n: int, forged: list[str] | None = None) -> list[int]:
    """`n` wrong keys (log-ins); each with the next forged X-Forwarded-For of `forged` if given."""
    out = []
    for i in range(n):
        headers = {"X-Forwarded-For": forged[i % len(forged)]} if forged else {}
        out.append(client.post(f"{url}/login", data={"password": f"guess{i}"}, headers=headers).status_code)
    return out


def right_key(client: httpx.Client, url: str, **headers: str) -> httpx.Response:
    return client.get(f"{url}/api/v1/audio/reference_audio", headers={**AUTH, **headers})


def locked(r: httpx.Response) -> bool:
    return r.status_code == 429 and "too many wrong API keys" in r.text and 1 <= int(r.headers["retry-after"]) <= 60


def test_behind_haproxy_one_clients_wrong_keys_do_not_lock_out_another(proxy):
    """The compose deployment: HAProxy at its own address in front of the frontends. One client's 30 wrong
    keys lock out that client, right key included, and a forged X-Forwarded-For does not get it out; another
    client's right key still works at once."""
    with client_from("127.0.0.1") as guesser, client_from("127.0.0.3") as other:
        assert guess(guesser, proxy, LIMIT) == [401] * LIMIT
        assert locked(right_key(guesser, proxy))
        assert locked(right_key(guesser, proxy, **{"X-Forwarded-For": "203.0.113.50"}))
        r = right_key(other, proxy)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        assert other.post(f"{proxy}/login", data={"password": KEY}).status_code == 200


def test_a_trusted_proxys_clients_are_told_apart_by_x_forwarded_for(apps):
    """From the trusted address, X-Forwarded-For names the client: one named client locked out, another not;
    the same header from an address that is not trusted counts for nothing."""
    trusting = apps[0].url.rstrip("/")
    with client_from(PROXY_SOURCE) as via_proxy, client_from("127.0.0.4") as stranger:
        assert guess(via_proxy, trusting, LIMIT, forged=["198.51.100.10"]) == [401] * LIMIT
        assert locked(right_key(via_proxy, trusting, **{"X-Forwarded-For": "198.51.100.10"}))
        assert right_key(via_proxy, trusting, **{"X-Forwarded-For": "198.51.100.11"}).status_code == 200
        # 127.0.0.4 is not a proxy: naming the locked-out client does not lock it out, it is itself
        assert right_key(stranger, trusting, **{"X-Forwarded-For": "198.51.100.10"}).status_code == 200
        # a network in the flag: a proxy at 192.0.2.x in front of 127.0.0.2 (a chain) is skipped too
        r = right_key(via_proxy, trusting, **{"X-Forwarded-For": "198.51.100.10, 192.0.2.7"})
        assert locked(r), (r.status_code, r.text[:200])


def test_without_trusted_proxies_a_forged_x_forwarded_for_is_ignored(apps):
    """No --trusted_proxies (the default): a local client's X-Forwarded-For counts for nothing. Forging a new
    address per guess does not escape the limit, and the addresses it names (here 127.0.0.5, a real
    client) are not locked out."""
    plain = apps[1].url.rstrip("/")
    with client_from("127.0.0.1") as guesser, client_from("127.0.0.5") as victim:
        assert guess(guesser, plain, LIMIT, forged=["127.0.0.5"]) == [401] * LIMIT  # aimed at 127.0.0.5
        r = right_key(victim, plain)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        escapes = guess(guesser, plain, 3, forged=["203.0.113.1", "203.0.113.2", "203.0.113.3"])
        assert escapes == [429] * 3, escapes
        assert locked(right_key(guesser, plain, **{"X-Forwarded-For": "203.0.113.200"}))


@pytest.mark.quick
def test_an_unusable_flag_value_stops_the_frontend_with_its_name(capsys):
    from cosy.frontend.options import parse_args
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--trusted_proxies", "10.0.0.5,proxy"])
    assert stop.value.code == 2
    assert "--trusted_proxies: 'proxy' is not an IP address or network" in capsys.readouterr().err
    assert [str(n) for n in parse_args(["--device", "cpu", "--trusted_proxies", "10.0.0.5"]).trusted_proxies] == [
        "10.0.0.5/32"]
    assert parse_args(["--device", "cpu"]).trusted_proxies == ()
