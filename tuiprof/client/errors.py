"""Human descriptions of why an agent could not be reached."""

from __future__ import annotations

import grpc


def describe_rpc_error(error: grpc.aio.AioRpcError, timeout: float) -> str:
    """One line naming what went wrong and what to do about it."""
    code = error.code()
    details = (error.details() or "").strip()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"refused: wrong or missing token ({details or 'UNAUTHENTICATED'}); "
            "pass --token-file or set TUIPROF_TOKEN"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot connect: {details or 'agent unavailable'}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout:g} s"
    return f"{code.name}: {details}" if details else code.name
