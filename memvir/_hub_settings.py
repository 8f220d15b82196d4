"""What the front ends (the CLI, the app) tell huggingface_hub before using it: send only the requests asked of it.

huggingface_hub 2.4.0 builds its user agent on every request; unless telemetry is off, the first one in a process
also fetches `{HF_ENDPOINT}/api/agent-harnesses` with a 3 s timeout of its own (utils._detect_agent), before the
request that was asked for, so against a Hub that does not answer `memvir.hub.pull`'s 2 s look-up waits for both
timeouts. Its only switch is the telemetry setting (HF_HUB_DISABLE_TELEMETRY, DISABLE_TELEMETRY or DO_NOT_TRACK), which
huggingface_hub reads once, when it is imported.
"""

import os
import sys

TELEMETRY_VARIABLE = "HF_HUB_DISABLE_TELEMETRY"


def turn_off_side_requests() -> None:
    """Turn huggingface_hub's telemetry (and with it the agent-harness look-up) off, unless the user set
    HF_HUB_DISABLE_TELEMETRY themselves: an explicit choice, either way, stands.

    Call it before huggingface_hub is imported; if it already was (gradio imports it), its setting is changed too,
    since it read the variable at import.
    """
    if TELEMETRY_VARIABLE in os.environ:
        return
    os.environ[TELEMETRY_VARIABLE] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_DISABLE_TELEMETRY = True
