"""InfluxDB's line protocol, written by hand and escaped completely."""
from __future__ import annotations

import math

# Line protocol, escaped completely. Hand-written rather than influxdb-client's Point,
# which leaves backslashes in tags as they are, so a value ending in one escapes the
# separator after it. A line feed ends a line in every parser (InfluxDB's and
# victoria-metrics'), and neither has an escape for it, so a line feed in a name, tag
# or string is written as the two characters \n: a name can never forge a point.
_KEY = str.maketrans({"\\": "\\\\", ",": "\\,", "=": "\\=", " ": "\\ ", "\n": "\\n"})
_MEASUREMENT = str.maketrans({"\\": "\\\\", ",": "\\,", " ": "\\ ", "\n": "\\n"})
_STRING = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def escape_tag(value) -> str:
    """A tag key, tag value or field key."""
    return str(value).translate(_KEY)


def field_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + str(v).translate(_STRING) + '"'


def line(measurement: str, tags: dict, fields: dict, ts_seconds: float) -> str | None:
    """One line of line protocol; None when there is no field to write.

    Empty tag values are left out (line protocol has none); NaN and infinite fields too
    (not representable): absent, not zero.
    """
    fields = {k: v for k, v in fields.items()
              if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
    if not fields:
        return None
    tag_text = "".join(f",{escape_tag(k)}={escape_tag(v)}" for k, v in sorted(tags.items()) if v not in (None, ""))
    field_text = ",".join(f"{escape_tag(k)}={field_value(v)}" for k, v in fields.items())
    return f"{measurement.translate(_MEASUREMENT)}{tag_text} {field_text} {int(ts_seconds * 1e9)}"
