// GPT-2's pre-tokenizer: the text is cut into chunks by the regular expression
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Python `regex` semantics: leftmost alternative first, greedy, over code points), and BPE
// then runs inside each chunk. std::regex has no \p{L}, so the expression is matched by
// hand over UTF-8 with the tables of unicode.h.
//
// Bytes that are not valid UTF-8 are taken one at a time as symbols (neither letter,
// number nor whitespace), as U+FFFD would be, so that any byte string splits into chunks
// that concatenate back to it.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

namespace tessera::data {

// Calls `fn` with each chunk of `text`, in order; the chunks concatenate to `text`.
void for_each_pretoken(std::string_view text, const std::function<void(std::string_view)>& fn);

// The chunks of `text`, as views into it.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace tessera::data
