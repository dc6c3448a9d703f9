// Replays token texts through llama.cpp's n-gram drafters, by its public speculative API, and prints every
// draft: the reference that tests/drafters/test_ngram_reference.py holds specdec's ngram-map-k,
// ngram-map-k4v and ngram-mod to. scripts/llama_ngram_drafts.py builds it and writes the test's data.
//
// stdin:  "<spec-type> <a> <b> <k>"  ngram-map-k, ngram-map-k4v: a = size_n, b = min_hits, size_m = k;
//                                    ngram-mod: a = n_match, b = n_min, n_max = k
//         then one request after another, on the same drafter: "<prompt length> <n> <n token ids>"
// stdout: one line per step, the draft's token ids (an empty line: no draft); "end" after each request.
//
// Each text is the answer of a greedy target: a draft keeps its longest prefix the text goes on with, and
// the step moves past the kept tokens and the target's own next one.
#include "common.h"
#include "speculative.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

int main() {
    std::string type;
    int a, b, k;
    std::cin >> type >> a >> b >> k;

    common_params_speculative params;
    params.types = {common_speculative_type_from_name(type)};
    if (type == "ngram-mod") {
        params.ngram_mod.n_match = a;
        params.ngram_mod.n_min = b;
        params.ngram_mod.n_max = k;
    } else {
        common_params_speculative_ngram_map & map = type == "ngram-map-k" ? params.ngram_map_k : params.ngram_map_k4v;
        map.size_n = a;
        map.min_hits = b;
        map.size_m = k;
    }
    common_speculative * spec = common_speculative_init(params, 1);

    size_t n_prompt, n_text;
    while (std::cin >> n_prompt >> n_text) {
        std::vector<llama_token> text(n_text);
        for (llama_token & t : text) std::cin >> t;
        common_speculative_begin(spec, 0, llama_tokens(text.begin(), text.begin() + n_prompt));

        size_t pos = n_prompt;  // text[pos] was just sampled; the history is text[0, pos)
        while (pos < text.size()) {
            llama_tokens history(text.begin(), text.begin() + pos);
            llama_tokens draft;
            common_speculative_get_draft_params(spec, 0) = {true, -1, (llama_pos) pos, text[pos], &history, &draft};
            common_speculative_draft(spec);
            size_t kept = 0;
            while (kept < draft.size() && pos + 1 + kept < text.size() && draft[kept] == text[pos + 1 + kept]) kept++;
            for (size_t i = 0; i < draft.size(); i++) printf(i ? " %d" : "%d", draft[i]);
            printf("\n");
            if (!draft.empty()) common_speculative_accept(spec, 0, (uint16_t) kept);
            pos += kept + 1;
        }
        printf("end\n");
    }
    common_speculative_free(spec);
    return 0;
}
