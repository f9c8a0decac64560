"""The speech-token LM on a remote backend (`launch/backend.py`: vLLM's OpenAI server), via the openai client.

`RemoteLM.generate` has the signature of `SpeechLM.generate`: the prompt goes as embeddings (base64 of
`torch.save` of an (L, H) tensor, vLLM's `prompt_embeds`), token ids stream back one per chunk, and the
backend's RAS logits processor (cosy.vllm_plugin.ras) samples from the same distribution as the
in-process sampler, seeded per request. Errors say what is wrong and how to fix it.

Each request carries the priority of the synthesis it serves (`cosy.lm.call`: vLLM's `priority`, lower
first, honoured by a backend started with `--scheduling-policy priority`, which `launch/backend.py` does);
a backend that refuses the field is asked again without it, and never again with it. The time a synthesis
waits for the backend's tokens is added to its call (`LMCall.backend_seconds`).

A generation stream that brings no token for `stall_timeout` seconds (the backend is alive but frozen, or
hopelessly overloaded) fails at once: `BackendUnavailable` before the first token (another backend may
take the request), `BackendError` after; it is not retried on the same backend.
"""
from __future__ import annotations

import base64
import io
import logging
import re
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import openai
import torch
from torch import Tensor

from cosy.errors import BadRequest, Cancelled, Unavailable
from cosy.lm.call import current_call
from cosy.lm.sampling import SamplingParams
from cosy.lm.watchdog import DEFAULT_QUEUE_TIMEOUT, DEFAULT_STALL_TIMEOUT, WATCHDOG
from cosy.model.families.cosyvoice2 import FAMILY as COSYVOICE2
from cosy.model.family import ModelFamily

log = logging.getLogger(__name__)


class BackendError(Unavailable, RuntimeError):
    """The LM backend failed or is misconfigured; the message names the backend and the fix."""


class BackendUnavailable(BackendError):
    """Nothing was generated yet and the backend could not be used: another backend may take the request."""


class TooLongForLM(BadRequest):
    """The backend refused a request as longer than its context (`max_model_len`): the same request fails the
    same way on any retry (400). The engine cuts its text to fit the context the backends report
    (`cosy.pipeline.lm_input.fit_context`), so this comes only while none has reported one yet."""


# how vLLM says a request does not fit its context: max_tokens over max_model_len, or the prompt over it
_CONTEXT_REFUSAL = re.compile(r"max_model_len|maximum context length", re.IGNORECASE)
# how a server without per-request priorities refuses the field (vLLM documents an error for a priority other
# than 0 without priority scheduling; a router or another server may refuse the unknown field)
_PRIORITY_REFUSAL = re.compile(r"priority", re.IGNORECASE)
# how often a backend whose context is not known yet (it did not answer) is asked again
CONTEXT_RETRY_SECONDS = 10.0
CONTEXT_ASK_TIMEOUT = 5.0  # seconds for that answer: a request waits for it


def encode_prompt_embeds(prompt_embeds: Tensor) -> str:
    """(1, L, H) or (L, H) -> base64 of `torch.save` of the (L, H) tensor, as vLLM's prompt_embeds wants."""
    buf = io.BytesIO()
    torch.save(prompt_embeds.detach().reshape(-1, prompt_embeds.shape[-1]).cpu().contiguous(), buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _wrong_url_hint(base_url: str) -> str:
    """Why a URL answered 404 for /models: it lacks /v1, or it is a frontend's address."""
    parts = urlsplit(base_url)
    if not parts.path.rstrip("/").endswith("/v1"):
        return f"the backend's URL ends in /v1: use {base_url.rstrip('/')}/v1"
    try:
        root = httpx.get(f"{parts.scheme}://{parts.netloc}/", timeout=5.0, follow_redirects=True)
        if "gradio" in root.text.lower() or "cosy frontend" in root.text.lower():
            return ("this is a cosy frontend (the Gradio/HTTP app), not an LM backend: use the address "
                    "`launch/backend.py` printed, e.g. http://HOST:8000/v1")
    except httpx.HTTPError:
        pass
    return "no LM backend answers there: use the URL `launch/backend.py` printed (http://HOST:PORT/v1)"


def _backend_reason(e: openai.APIStatusError) -> str:
    """The message of a backend's error answer ({"error": {"message": ...}}), else the client's."""
    body = e.body if isinstance(e.body, dict) else {}
    error = body.get("error", body)
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or e.message)


def smallest_context(backends: list["RemoteLM"]) -> int | None:
    """The context of a pool of backends: the smallest `context_length` among those known (a request must
    fit whichever takes it); None while none is known."""
    known = [n for b in backends if (n := b.context_length()) is not None]
    return min(known) if known else None


class RemoteLM:
    """One backend. Thread-safe: the openai client pools connections; requests share nothing else."""

    def __init__(self, base_url: str, api_key: str | None, model: str, sampling: SamplingParams | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 120.0, retries: int = 2,
                 family: ModelFamily | None = None, stall_timeout: float = DEFAULT_STALL_TIMEOUT,
                 queue_timeout: float = DEFAULT_QUEUE_TIMEOUT):
        """family: of the frontend's model directory (its token ids); None stands for CosyVoice2.
        stall_timeout: the longest wait for the answer's start (any byte) and for each next token of a
        generation; queue_timeout: the longest wait for the first token while the backend sends only its
        queue keep-alives (`cosy.lm.watchdog`)."""
        self.base_url = base_url.rstrip("/")
        self.model = model  # the served model name, <family prefix>-<llm.pt fingerprint>
        self.sampling = sampling or SamplingParams()
        self.family = family or COSYVOICE2
        self.tokens = self.family.tokens
        self.retries = retries
        self.connect_timeout, self.stall_timeout, self.queue_timeout = connect_timeout, stall_timeout, queue_timeout
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "none", max_retries=0,
                                    timeout=httpx.Timeout(read_timeout, connect=connect_timeout))
        self._context: int | None = None  # the backend's max_model_len, once it said
        self._context_asked = float("-inf")  # when it was last asked (time.monotonic())
        self._asking = threading.Lock()  # one request thread asks; the others go on without waiting
        self.send_priority = True  # False once the backend refused the `priority` field

    def context_length(self) -> int | None:
        """The most tokens (prompt and output) one request may hold: the `max_model_len` the backend lists for
        our model in /v1/models, read by `check` or asked here (at most every CONTEXT_RETRY_SECONDS while the
        backend does not answer); None while unknown."""
        if (self._context is None and time.monotonic() - self._context_asked >= CONTEXT_RETRY_SECONDS
                and self._asking.acquire(blocking=False)):
            try:
                self.check(timeout=CONTEXT_ASK_TIMEOUT)
            except BackendError:
                pass
            finally:
                self._asking.release()
        return self._context

    def check(self, timeout: float | None = None) -> None:
        """Reachable, key accepted, and serving our llm.pt; else BackendError (Unavailable if unreachable).
        `timeout`: for the answer (seconds; None: the client's read timeout)."""
        self._context_asked = time.monotonic()
        client = self.client if timeout is None else self.client.with_options(timeout=timeout)
        try:
            models = client.models.list().data
            served = [m.id for m in models]
        except openai.AuthenticationError:
            raise BackendError(f"the LM backend at {self.base_url} refused the API key (401): pass the key the "
                               "backend was started with (--llm_api_key)") from None
        except openai.NotFoundError:
            raise BackendError(f"{self.base_url} is not an LM backend URL (404 on /models): "
                               f"{_wrong_url_hint(self.base_url)}") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise BackendUnavailable(f"cannot reach the LM backend at {self.base_url} ({e})") from None
        except openai.APIStatusError as e:
            raise BackendUnavailable(f"the LM backend at {self.base_url} answered {e.status_code}") from None
        if self.model not in served:
            theirs = {name.rsplit("-", 1)[0] for name in served} - {self.model.rsplit("-", 1)[0]}
            if theirs and len(served) == len(theirs):  # every served model is of another family
                raise BackendError(f"the LM backend at {self.base_url} serves a {', '.join(sorted(theirs))} model "
                                   f"({', '.join(served)}), but this frontend's model directory is "
                                   f"{self.family.name}: start the backend on the same model directory")
            raise BackendError(f"the LM backend at {self.base_url} serves {', '.join(served) or 'nothing'}, but this "
                               f"frontend's llm.pt is {self.model}: start the backend on the same model "
                               "directory (a different or fine-tuned llm.pt would give wrong speech)")
        ours = next(m for m in models if m.id == self.model)
        context = getattr(ours, "max_model_len", None)  # vLLM's extra field
        if isinstance(context, int) and context > 0:
            self._context = context

    def _request(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int, p: SamplingParams,
                 stop: list[int] | None = None, history: list[int] | None = None, logprobs: bool = False):
        xargs = {"cosy_min_len": int(min_len), "cosy_ras": 0 if p.greedy else 1, "cosy_top_p": float(p.top_p),
                 "cosy_top_k": int(p.top_k), "cosy_win": int(p.win_size), "cosy_tau": float(p.tau_r)}
        if history and not p.greedy:  # RAS window of a continued decode (cosy.lm.bistream)
            xargs["cosy_history"] = [int(t) for t in history[-p.win_size:]] if p.win_size > 0 else []
        if stop is None:
            stop = [] if p.ignore_stop else list(self.tokens.stop)
        if p.ignore_stop:
            xargs["cosy_ignore_stop"] = 1
        extra = {"prompt_embeds": encode_prompt_embeds(prompt_embeds), "return_token_ids": True,
                 "stop_token_ids": stop, "ignore_eos": p.ignore_stop, "top_k": -1, "vllm_xargs": xargs}
        if logprobs:  # the backend has no tokenizer: log-probs come keyed by "token_id:N"
            extra["return_tokens_as_token_ids"] = True
        call = current_call()
        if call is not None and self.send_priority and call.vllm_priority:  # 0, vLLM's default, goes unsaid
            extra["priority"] = call.vllm_priority
        # plain sampling: the backend's logits processor already turned the row into the RAS distribution.
        # prompt: an empty id list, not null: vLLM reads the prompt from prompt_embeds either way, and a router
        # that parses the body (vllm-router) rejects a null or missing prompt (422)
        return self.client.completions.create(
            model=self.model, prompt=[], max_tokens=int(max_len), temperature=0.0 if p.greedy else 1.0,
            top_p=1.0, stream=True, seed=int(seed), logprobs=1 if logprobs else None,
            timeout=httpx.Timeout(self.stall_timeout, connect=self.connect_timeout),  # per read: between tokens
            extra_body=extra)

    def _open(self, *args, retries: int | None = None) -> object:
        """Start the request, retrying connection failures and 5xx answers before anything streamed
        (`retries` times; None: the backend's `retries`)."""
        delay, retries = 0.5, self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                return self._request(*args)
            except openai.AuthenticationError:
                raise BackendError(f"the LM backend at {self.base_url} refused the API key (401): pass the key "
                                   "the backend was started with (--llm_api_key)") from None
            except openai.NotFoundError as e:
                raise BackendError(f"the LM backend at {self.base_url} answered 404 ({e.message}): "
                                   f"{_wrong_url_hint(self.base_url)}") from None
            except openai.BadRequestError as e:
                if self._priority_refused(e):  # asked once more, without the field (never sent again)
                    return self._open(*args, retries=retries)
                raise self._refused(e) from None
            except openai.RateLimitError as e:  # busy (a router in front): another backend, or later, may take it
                raise BackendUnavailable(f"the LM backend at {self.base_url} is busy ({e.message})") from None
            except openai.APITimeoutError:  # frozen or overloaded: waiting again here would only add stalls
                raise BackendUnavailable(self._stalled(0)) from None
            except (openai.APIConnectionError, openai.InternalServerError) as e:
                if attempt == retries:
                    raise BackendUnavailable(f"cannot reach the LM backend at {self.base_url} ({e})") from None
                time.sleep(delay)
                delay *= 2
            except openai.APIStatusError as e:  # another 4xx (every 5xx is an InternalServerError)
                raise self._refused(e) from None
        raise AssertionError("unreachable")

    def _priority_refused(self, e: openai.APIStatusError) -> bool:
        """Whether the backend refused the request for its `priority` field (it has no priority scheduling);
        then it is never sent to this backend again, and the caller asks once more without it."""
        call = current_call()
        if not self.send_priority or call is None or not call.vllm_priority:
            return False
        if not _PRIORITY_REFUSAL.search(_backend_reason(e)):
            return False
        self.send_priority = False
        log.warning("the LM backend at %s refused the request's priority (%s): requests go to it without "
                    "priorities (start it with --scheduling-policy priority: launch/backend.py does)",
                    self.base_url, _backend_reason(e))
        return True

    def _refused(self, e: openai.APIStatusError) -> Exception:
        """A 4xx answer to a request: the same request would get it again, so never a retry-advised 503. Longer
        than the context: a 400 saying so; anything else: ours to fix (500), with the backend's reason."""
        reason = _backend_reason(e)
        if _CONTEXT_REFUSAL.search(reason):
            return TooLongForLM(f"the text is too long for the LM in one piece: the LM backend refused it ({reason}); "
                                "shorten the text's sentences, or the prompt (prompt_text, prompt audio)")
        return BackendError(f"the LM backend at {self.base_url} rejected the request ({e.status_code}): {reason}",
                            status=500)

    def _stalled(self, produced: int, queued: bool = False) -> str:
        if queued:
            return (f"the LM backend at {self.base_url} gave no token in {self.queue_timeout:g} s, only its queue "
                    "keep-alives (--llm_queue_timeout): overloaded or its engine is frozen; the request was "
                    "not completed")
        return (f"the LM backend at {self.base_url} stalled: no token for {self.stall_timeout:g} s after "
                f"{produced} tokens (--llm_stall_timeout); the request was not completed")

    def generate(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int | None = None,
                 params: SamplingParams | None = None, retries: int | None = None,
                 history: list[int] | None = None) -> Iterator[int]:
        """Yield speech tokens as the backend streams them (never a stop token). Closing the iterator
        closes the HTTP stream, which aborts the request on the backend. `retries`, `history` (the outputs
        of a continued decode): see `complete`."""
        p = params or self.sampling
        for token in self.complete(prompt_embeds, max_len, min_len, None, seed, p, history, retries=retries):
            if token in self.tokens.stop and not p.ignore_stop:
                return
            yield token

    def complete(self, prompt_embeds: Tensor, max_new: int, min_len: int = 0, stop: list[int] | None = None,
                 seed: int | None = None, params: SamplingParams | None = None, history: list[int] | None = None,
                 logps: list[float] | None = None, retries: int | None = None) -> Iterator[int]:
        """Yield up to max_new tokens continuing `prompt_embeds` (1, L, H), the one of `stop` (default: the
        family's stop ids) that ended the answer included. `history`: outputs before this prompt's end, the
        RAS window of a continued decode; `logps`: filled with each token's log-prob (log_softmax of the
        raw logits); `retries`: of a failed start (None: this backend's). Closing the iterator aborts the
        request on the backend."""
        p = params or self.sampling
        seed = seed if seed is not None else int(torch.randint(0, 2**31 - 1, (1,)).item())
        call, waiting = current_call(), time.monotonic()  # the backend's time: from here to each token
        try:
            stream = self._open(prompt_embeds, min_len, max_new, seed, p, stop, history, logps is not None,
                                retries=retries)
        finally:
            if call is not None:
                call.backend_seconds += time.monotonic() - waiting
        waiting = time.monotonic()
        produced, finish = 0, None
        vocab = self.tokens.vocab
        # bytes are not tokens: the queue keep-alives reset httpx's read timeout, not this clock
        watch = WATCHDOG.watch(stream.response.close, time.monotonic() + self.queue_timeout)
        try:
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                finish = choice.finish_reason or finish
                if logps is not None and choice.logprobs is not None:
                    logps.extend(choice.logprobs.token_logprobs or [])
                for token in getattr(choice, "token_ids", None) or []:  # usually one per chunk, sometimes more
                    if not isinstance(token, int) or not 0 <= token < vocab:
                        raise BackendError(f"the LM backend at {self.base_url} returned an invalid speech token "
                                           f"{token!r}: is it serving a {self.family.name} model?")
                    produced += 1
                    watch.pause()  # the caller's time with the token is not the backend's
                    if call is not None:
                        call.backend_seconds += time.monotonic() - waiting
                    waiting = None
                    yield token
                    waiting = time.monotonic()
                    watch.restart(self.stall_timeout)
            if finish not in ("stop", "length"):  # the server went away (or aborted us) mid-request
                error = BackendUnavailable if produced == 0 else BackendError
                raise error(f"the LM backend at {self.base_url} failed after {produced} tokens (the stream "
                            f"ended with finish_reason {finish!r}); the request was not completed")
        except Exception as e:
            error = BackendUnavailable if produced == 0 else BackendError
            if watch.cancelled:  # closed by the watchdog for the job's cancel (`Watchdog.abort_when`)
                raise Cancelled("the request was cancelled") from None
            if watch.expired:  # closed by the watchdog: whatever the read raised, it was the token clock
                raise error(self._stalled(produced, queued=produced == 0)) from None
            if isinstance(e, (openai.APITimeoutError, httpx.TimeoutException)):
                raise error(self._stalled(produced)) from None
            if isinstance(e, (openai.APIError, httpx.HTTPError)):
                if produced == 0:
                    raise BackendUnavailable(f"the LM backend at {self.base_url} failed before the first token "
                                             f"({e})") from None
                raise BackendError(f"the LM backend at {self.base_url} failed after {produced} tokens ({e}); "
                                   "the request was not completed") from None
            raise
        finally:
            if call is not None and waiting is not None:  # the wait for what came after the last token
                call.backend_seconds += time.monotonic() - waiting
            watch.done()
            stream.close()
