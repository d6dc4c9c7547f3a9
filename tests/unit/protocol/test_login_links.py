"""One-click login codes: good once, until they expire, for the token that minted them only."""

from __future__ import annotations

from devsched.protocol import login_links

TOKEN = "a-token-of-the-operator-0123456789"
NOW = 1_800_000_000.0


def test_a_code_checks_with_its_token_until_it_expires() -> None:
    code = login_links.mint(TOKEN, NOW)
    checked = login_links.check(TOKEN, code, NOW + login_links.LINK_S - 1)
    assert checked is not None
    assert checked.expires_at == int(NOW) + login_links.LINK_S
    assert login_links.check(TOKEN, code, NOW + login_links.LINK_S) is None  # expired
    assert login_links.check("another-token-of-16-chars-or-more", code, NOW) is None


def test_a_code_holds_no_token_and_a_link_fits_an_80_column_line() -> None:
    code = login_links.mint(TOKEN, NOW)
    assert TOKEN not in code
    link = login_links.link("http://127.0.0.1:65535/", code)
    assert link == f"http://127.0.0.1:65535/login?k={code}"
    assert len("login " + link) <= 80


def test_anything_else_is_no_code() -> None:
    code = login_links.mint(TOKEN, NOW)
    nonce, expiry, mac = code.split(".")
    later = login_links._base36(int(expiry, 36) + 3600)
    for bad in (None, 7, "", code + "x", f"{nonce}.{later}.{mac}", f"{nonce[:-1]}A.{expiry}.{mac}", "é" * 40,
                code.replace(".", "-"), "x" * 10_000):  # fmt: skip
        assert login_links.check(TOKEN, bad, NOW) is None, bad


def test_a_code_is_good_once() -> None:
    used = login_links.UsedCodes()
    first = login_links.check(TOKEN, login_links.mint(TOKEN, NOW), NOW)
    second = login_links.check(TOKEN, login_links.mint(TOKEN, NOW), NOW)
    assert first is not None
    assert second is not None
    assert used.use(first, NOW)
    assert not used.use(first, NOW + 1)
    assert used.use(second, NOW + 1)
    assert not used.use(second, NOW + 2)
