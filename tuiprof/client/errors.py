"""Human descriptions of why an agent could not be reached."""

from __future__ import annotations

import grpc

_TOKEN_ADVICE = {
    True: "the agent does not accept this token; check that --token-file (or $TUIPROF_TOKEN) "
          "holds the agent's token",
    False: "the agent needs a token; pass --token-file FILE or set $TUIPROF_TOKEN",
    None: "wrong or missing token; give the agent's token with --token-file FILE or $TUIPROF_TOKEN",
}


def describe_rpc_error(error: grpc.aio.AioRpcError, timeout: float, token_given: bool | None = None) -> str:
    """One line naming what went wrong and what to do about it.

    ``token_given`` (whether the call carried a token) picks the advice for a
    refusal; the agent's own refusal text is generic, so it is not repeated.
    """
    code = error.code()
    details = (error.details() or "").strip()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return "refused: " + _TOKEN_ADVICE[token_given]
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot connect: {details or 'agent unavailable'}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout:g} s"
    return f"{code.name}: {details}" if details else code.name
