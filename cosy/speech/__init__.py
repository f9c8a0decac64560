"""The speech stage as an engine: many live requests per worker process, their flow/HiFT work scheduled.

cache.py      the memory budget of streaming flow state and the LRU of saved voices' prompt state
request.py    one live request in a worker (its job, cancel flag, arrival, whether its first chunk was sent)
scheduler.py  the queue of due flow/HiFT work items (by class, first chunks first, then oldest) and its runner
worker.py     the worker process's job loop holding up to max_batch requests at once
"""
