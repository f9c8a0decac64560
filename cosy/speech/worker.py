"""A worker process's job loop holding up to `max_batch` requests at once (the new speech-stage path).

The parent's dispatcher sends at most `max_batch` live jobs to this process; each runs on its own thread
(its LM stream advances concurrently with the others), and its flow/HiFT work goes through one
`SpeechScheduler`. A cancel frees the slot at once: the job's terminal "done" is sent right away, its
queued work is skipped and its thread closes the synthesis (a remote LM request is aborted). A failing
request sends its own error; its companions never see it.
"""
from __future__ import annotations

import logging
import threading
import time

from cosy.errors import Cancelled, JobError
from cosy.lm.call import start_call
from cosy.pipeline.request import PRIORITY_AGING, SynthesisRequest
from cosy.speech.request import LiveRequest
from cosy.speech.scheduler import SpeechScheduler

log = logging.getLogger(__name__)
JOIN_TIMEOUT = 10.0  # s the worker waits for its cancelled jobs' threads before it exits


def serve(engine, conn, flow_batch: int = 1, aging: float = PRIORITY_AGING) -> None:
    """Answer the dispatcher's messages until it sends None (the pipe protocol of `cosy.service.process`).

    flow_batch: most requests whose whole-utterance or final-chunk flow runs as one padded batch; aging:
    seconds a work item takes to move up one priority class (the pool's --priority_aging)."""
    scheduler = SpeechScheduler(max_rows=flow_batch, aging=aging)
    engine.speech_runner = scheduler.run
    send_lock = threading.Lock()
    live: dict[int, LiveRequest] = {}
    threads: list[threading.Thread] = []

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    def work(r: LiveRequest) -> None:
        scheduler.bind(r)
        chunks = call = None
        try:
            if r.kind == "features":
                result = engine.prompt_features(r.payload["source"]).to_arrays()
                if not r.cancelled.is_set():
                    send(("result", r.id, result))
            else:
                req = SynthesisRequest.from_wire(r.payload)
                call = start_call(req.priority)  # this thread's LM requests carry its class, report their wait
                chunks = (engine.synthesize_duplex(req, r.pieces(), lambda text: send(("taken", r.id, text)),
                                                   on_mark=lambda mark: send(("mark", r.id, mark.to_wire())))
                          if r.kind == "duplex" else
                          engine.synthesize(req, on_mark=lambda mark: send(("mark", r.id, mark.to_wire()))))
                for chunk in chunks:
                    if r.cancelled.is_set():
                        break
                    send(("chunk", r.id, chunk.numpy()))
                    if not r.heard:
                        scheduler.heard(r)
            if r.end():
                send(("done", r.id, None if call is None else {"backend_seconds": call.backend_seconds}))
        except Cancelled:
            pass
        except Exception as e:
            log.debug("job %s failed", r.id, exc_info=True)
            if r.end():
                send(("error", r.id, JobError.wire(e)))
        finally:
            if chunks is not None:
                try:
                    chunks.close()  # stops the LM (a remote backend aborts the request)
                except Exception:
                    log.debug("closing job %s", r.id, exc_info=True)
            live.pop(r.id, None)

    try:
        while (msg := conn.recv()) is not None:
            if msg[0] == "text":
                if (r := live.get(msg[1])) is not None:
                    r.text.put(msg[2])
                continue
            if msg[0] == "cancel":
                r = live.get(msg[1])
                if r is not None:
                    r.cancelled.set()
                    if r.end():  # the slot is free now; the thread unwinds on its own
                        send(("done", r.id, None))
                continue
            job_id, kind, payload = msg
            r = live[job_id] = LiveRequest(job_id, kind, payload)
            threads = [t for t in threads if t.is_alive()]
            threads.append(threading.Thread(target=work, args=(r,), daemon=True, name=f"job-{job_id}"))
            threads[-1].start()
    finally:
        # the process ends after this: no job thread may still hold tensors then (see SpeechScheduler.close)
        for r in list(live.values()):
            r.cancelled.set()
        scheduler.close()
        deadline = time.monotonic() + JOIN_TIMEOUT
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
