"""The losses score the target's answers, not the prompts: drafting proposes answer tokens only, so a pair or
an anchor counts where its token comes after the chat template's generation prompt (data.answer_start)."""

import copy

import pytest
import torch

from specdec.model.load import open_checkpoint
from specdec.train.block_loss import block_loss, sample_anchors
from specdec.train.data import answer_marker, answer_start, chat_prompt_ids
from specdec.train.heads import build_block_model, build_eagle3_head
from specdec.train.loop import pad_batch
from specdec.train.target import DenseTarget, TargetOutputs
from specdec.train.ttt import ttt_loss


def test_answer_start_is_after_the_last_marker():
    assert answer_start([5, 1, 2, 7, 8], (1, 2)) == 3
    assert answer_start([1, 2, 9, 1, 2, 7], (1, 2)) == 5  # a conversation: the last turn's answer
    assert answer_start([5, 1, 2], (1, 2)) == 3  # an empty answer scores nothing
    assert answer_start([5, 6, 7], (1, 2)) == 0  # a corpus chunk: all of it
    assert answer_start([5, 1, 2], ()) == 0  # a model without a chat template


def test_the_marker_is_the_chat_templates_generation_prompt(tiny_model, smollm):
    for tok in (tiny_model.tokenizer, smollm.tokenizer):
        marker = answer_marker(tok)
        assert tok.decode(list(marker)) == "<|im_start|>assistant\n"
        prompt = chat_prompt_ids(tok, "Write a poem about owls.")
        assert answer_start(prompt + [100, 101, 102], marker) == len(prompt)
    gemma = copy.copy(tiny_model.tokenizer)
    gemma.chat_template = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                           "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    assert gemma.decode(list(answer_marker(gemma))) == "<start_of_turn>model\n"
    plain = copy.copy(tiny_model.tokenizer)
    plain.chat_template = None
    assert answer_marker(plain) == ()


class PromptRowsChanged:
    """The target, with its final hidden rows and top ids replaced by noise before `start`: what the losses read
    of the prompt's own predictions."""

    def __init__(self, target: DenseTarget, start: int):
        self.target, self.start = target, start

    def outputs(self, tokens, valid, hidden_layers=()):
        out = self.target.outputs(tokens, valid, hidden_layers)
        last, top = out.last.clone(), out.top.clone()
        g = torch.Generator().manual_seed(0)
        last[:, : self.start] = torch.randn(last[:, : self.start].shape, generator=g) * 5
        top[:, : self.start] = torch.randint(0, 50, top[:, : self.start].shape, generator=g)
        return TargetOutputs(self.target, out.hidden, last, top)


@pytest.fixture(scope="module")
def chat_batch(tiny_model, tiny_hf_dir):
    tok = tiny_model.tokenizer
    marker = answer_marker(tok)
    prompts = [chat_prompt_ids(tok, "the quick brown fox"), chat_prompt_ids(tok, "jumps over the lazy dog today")]
    g = torch.Generator().manual_seed(1)
    seqs = [p + torch.randint(3, 200, (12 + 4 * i,), generator=g).tolist() for i, p in enumerate(prompts)]
    target = DenseTarget(open_checkpoint(tiny_hf_dir)[0])
    return seqs, marker, target, min(len(p) for p in prompts)


def test_ttt_scores_the_answers_pairs_only(chat_batch):
    seqs, marker, target, start = chat_batch
    tokens, valid, answer = pad_batch(seqs, "cpu", marker)
    for b, s in enumerate(seqs):
        start_b = answer_start(s, marker)
        assert answer[b].nonzero()[0].item() == start_b and int(answer[b].sum()) == len(s) - start_b
    head = build_eagle3_head(target, torch.arange(256), seed=0)
    draft_ids = head.draft_to_target()
    with torch.no_grad():
        loss, matches, counts = ttt_loss(head, "eagle3", target, tokens, valid, 3, draft_ids, answer)
        changed, _, counts2 = ttt_loss(head, "eagle3", PromptRowsChanged(target, start), tokens, valid, 3,
                                       draft_ids, answer)
        everywhere = ttt_loss(head, "eagle3", PromptRowsChanged(target, start), tokens, valid, 3, draft_ids)[0]
    # step 0 counts the pairs (f_j, x_{j+1}) whose x_{j+1} is an answer token and whose label x_{j+2} exists
    assert counts[0] == sum(len(s) - answer_start(s, marker) - 1 for s in seqs)
    assert torch.equal(loss, changed) and counts == counts2  # the prompt's rows are never read
    assert not torch.isclose(loss, everywhere)  # ... and without the answer mask they are


def test_block_anchors_sit_on_the_answer(chat_batch, tiny_hf_dir):
    seqs, marker, target, start = chat_batch
    tokens, valid, answer = pad_batch(seqs, "cpu", marker)
    anchors, keep = sample_anchors(valid, 6, torch.Generator().manual_seed(0), answer)
    assert keep.any()
    assert answer.gather(1, anchors)[keep].all()
    model = build_block_model(target, "dflash", 4, 1, (0, 1), target.config.vocab_size - 1)
    with torch.no_grad():
        loss = block_loss(model, target, tokens, valid, anchors, keep)[0]
        changed = block_loss(model, PromptRowsChanged(target, start), tokens, valid, anchors, keep)[0]
    assert torch.equal(loss, changed)
