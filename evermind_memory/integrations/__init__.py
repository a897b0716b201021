"""Framework interfaces over MemoryStore, each imported only when asked for (`import evermind_memory` loads none).

async_store.py (AsyncMemoryStore: every MemoryStore method as a coroutine, run in a thread; stdlib only),
langchain.py (a LangChain VectorStore and Embeddings; the `langchain` extra), langgraph.py (a LangGraph
BaseStore; the `langgraph` extra), threads.py (running blocking calls from asyncio so a cancelled await never
cuts one in half). They use the public MemoryStore API only.
"""
