"""What a reload says it did to the metrics endpoint's security: a change only where there is one."""
from iowarden.daemon.outputs.web_config import WebConfig
from iowarden.daemon.outputs.wiring import endpoint_change


def test_an_unchanged_file_reads_as_kept_not_as_a_downgrade():
    plain = WebConfig()
    said = endpoint_change(plain, WebConfig())
    assert said.startswith("kept as it was (no TLS, no basic auth") and "now" not in said, said


def test_a_real_change_says_what_it_was_and_what_it_is():
    assert endpoint_change(WebConfig(users={"p": b"h"}), WebConfig()) == \
        "was no TLS, basic auth for 1 user, now no TLS, no basic auth"
    assert endpoint_change(WebConfig(users={"p": b"h"}), WebConfig(users={"p": b"other"})) == \
        "no TLS, basic auth for 1 user, the users' passwords or names changed"
