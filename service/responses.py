"""A JSON response straight from a response model.

FastAPI re-validates whatever a route returns against its response_model, and for a plain `def` route does
so in a second thread-pool hop. The hot routes build their body through the model already (so it is
valid by construction) and return it serialised; `response_model` on the route still documents it.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Response
from pydantic import BaseModel


def model_response(
    model: BaseModel, status_code: int = 200, *, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        model.model_dump_json(), status_code=status_code, media_type="application/json", headers=headers
    )
