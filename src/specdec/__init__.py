"""specdec: speculative decoding with provably identical output.

    import specdec
    llm = specdec.LLM("smollm2-135m")
    print(llm.generate("def fib(n):", max_tokens=32).text)

The library is specdec.api (LLM, Stream) and specdec.completion (Completion, Timing); docs/library.md
is its guide. The command line is specdec.cli.
"""

__version__ = "0.1.0"  # before the imports: a module they load may read it while this one is half-initialised

from specdec.api import LLM, Stream
from specdec.completion import Completion, Timing
from specdec.engine.stats import SpecStats
from specdec.sampling import SamplingParams

__all__ = ["LLM", "Stream", "Completion", "Timing", "SpecStats", "SamplingParams", "__version__"]
