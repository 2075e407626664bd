"""Routes of pinned documents: POST /v1/cache/documents (a name, and text or token ids) pins
a prefix, GET lists them, DELETE /v1/cache/documents/{name} unpins one."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from hyla.cache.documents import MAX_NAME_LEN, Document, DocumentError
from hyla.engine.documents import (
    list_documents,
    pin_document_async,
    unpin_document,
)
from hyla.server.errors import GET_RESPONSES, POST_RESPONSES, APIError, to_api_error

PATH = "/v1/cache/documents"


class DocumentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME_LEN)
    text: str | None = None
    token_ids: list[int] | None = None


def _as_json(doc: Document) -> dict[str, Any]:
    return {
        "object": "cache.document",
        "name": doc.name,
        "num_prompt_tokens": doc.num_prompt_tokens,
        "num_pinned_tokens": doc.num_tokens,
    }


def add_document_routes(app: FastAPI, engine: Any) -> None:
    """`engine`: the server's AsyncEngine."""

    @app.post(PATH, responses=POST_RESPONSES)
    async def pin(body: DocumentRequest) -> JSONResponse:
        if (body.text is None) == (body.token_ids is None):
            raise APIError(400, "text: give exactly one of text or token_ids", param="text")
        prompt = body.text if body.text is not None else body.token_ids
        sent = "text" if body.text is not None else "token_ids"
        try:
            doc = await pin_document_async(engine, body.name, prompt)
        except DocumentError as e:
            param = sent if e.field == "prompt" else e.field
            message = str(e).replace(e.field, param, 1)
            raise APIError(400, message, param=param, code="invalid_value") from None
        except Exception as e:  # noqa: BLE001 - the server's mapping (field errors are 400)
            err = to_api_error(e)
            if err.param == "prompt":  # the client sent it as text or token_ids
                err.param = sent
            raise err from None
        return JSONResponse(_as_json(doc))

    @app.get(PATH, responses=GET_RESPONSES)
    async def documents() -> JSONResponse:
        docs = await engine.call(list_documents)
        return JSONResponse({"object": "list", "data": [_as_json(d) for d in docs]})

    @app.delete(PATH + "/{name}", responses=GET_RESPONSES)
    async def unpin(name: str) -> JSONResponse:
        if not await engine.call(unpin_document, name):
            raise APIError(404, f"name: no pinned document {name!r}", param="name")
        return JSONResponse({"object": "cache.document.deleted", "name": name, "deleted": True})
