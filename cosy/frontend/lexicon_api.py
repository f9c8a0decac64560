"""The shared pronunciation lexicon over HTTP (behind the API key, as every API route):

    GET    /api/v1/lexicon            -> {entries: [{word, kind, value}], count, bytes, max_entries, max_bytes,
                                          error: why the file does not load (the last good entries serve), or null}
    GET    /api/v1/lexicon/{word}     -> {word, kind, value}                       (404 if none)
    POST   /api/v1/lexicon            {word, kind, value} -> 201 the entry        (409 if the word has one)
    PUT    /api/v1/lexicon/{word}     {kind, value} -> the entry (201 when new, else 200)
    DELETE /api/v1/lexicon/{word}     -> {"deleted": word}                         (404 if none)

kind: py (pinyin with tone numbers: "chong2 qing4"), cmu (CMU phones: "HH AH0 L OW1") or sub (a replacement
text). A bad entry is a 400 naming the problem, a full lexicon a 413 (`cosy.deploy.lexicon`). The lexicon
lives in the data dir (lexicon.tsv): a change is used by every frontend on it from its next request on.
"""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from cosy.frontend.api_routing import add_route, api_router
from cosy.frontend.service import FrontendService

BASE = "/api/v1/lexicon"


class EntryFields(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str
    value: str


class NewEntry(EntryFields):
    word: str


def build_lexicon_router(service: FrontendService, dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["lexicon"])
    store = service.data.lexicon

    async def list_entries():
        """Every entry, by word, and whether the lexicon file loads."""
        return await run_in_threadpool(store.status)

    async def get_entry(word: str):
        return (await run_in_threadpool(store.get, word)).to_dict()

    async def add_entry(body: NewEntry):
        """Add an entry (409 if its word has one: change it with PUT)."""
        entry, _ = await run_in_threadpool(store.put, body.word, body.kind, body.value, True)
        return JSONResponse(entry.to_dict(), status_code=201)

    async def put_entry(word: str, body: EntryFields):
        """Add or change the entry of `word`."""
        entry, new = await run_in_threadpool(store.put, word, body.kind, body.value)
        return JSONResponse(entry.to_dict(), status_code=201 if new else 200)

    async def delete_entry(word: str):
        await run_in_threadpool(store.delete, word)
        return {"deleted": word}

    add_route(router, "GET", BASE, list_entries, summary="List the lexicon")
    add_route(router, "POST", BASE, add_entry, summary="Add a lexicon entry")
    add_route(router, "GET", BASE + "/{word:path}", get_entry, summary="Get a lexicon entry")
    add_route(router, "PUT", BASE + "/{word:path}", put_entry, summary="Add or change a lexicon entry")
    add_route(router, "DELETE", BASE + "/{word:path}", delete_entry, summary="Delete a lexicon entry")
    return router
