"""LangChain's own standard suites (langchain-tests) run against EvermindVectorStore and EvermindEmbeddings.

The vector store suite runs twice: on the shipped model (our default embedder) and on the suite's own
DeterministicFakeEmbedding, through LangChainEmbedder (a LangChain Embeddings as the store's embedder). Their
async tests are plain coroutines; anyio's plugin runs them (the class mark).
"""

from __future__ import annotations

import pytest
from extras import require

require("langchain_tests", "test")

from langchain_tests.integration_tests import EmbeddingsIntegrationTests, VectorStoreIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import EmbeddingsUnitTests  # noqa: E402

from evermind_memory.integrations.langchain import EvermindEmbeddings, EvermindVectorStore  # noqa: E402


class TestVectorStoreOnTheShippedModel(VectorStoreIntegrationTests):
    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def vectorstore(self, tmp_path):
        with EvermindVectorStore(tmp_path / "lc.db") as vs:
            yield vs


class TestVectorStoreOnLangChainEmbeddings(VectorStoreIntegrationTests):
    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def vectorstore(self):
        with EvermindVectorStore(":memory:", self.get_embeddings()) as vs:
            yield vs


class TestEmbeddingsIntegration(EmbeddingsIntegrationTests):
    pytestmark = pytest.mark.anyio

    @property
    def embeddings_class(self) -> type[EvermindEmbeddings]:
        return EvermindEmbeddings


class TestEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[EvermindEmbeddings]:
        return EvermindEmbeddings
