// kvx eval's task names and the small result helpers of eval.h.
#include <map>
#include <set>

#include "eval/eval.h"

namespace kvx::eval {

namespace {

constexpr std::string_view kValidTasks =
    "ppl, kld, copy, passkey, lines, needle, niah_word, niah_number, niah_uuid, niah_multikey, niah_multivalue, vt "
    "(or the groups niah, ruler, all)";

}  // namespace

std::string_view TaskName(Task t) {
  switch (t) {
    case Task::kPpl:
      return "ppl";
    case Task::kKld:
      return "kld";
    case Task::kCopy:
      return "copy";
    case Task::kPasskey:
      return "passkey";
    case Task::kLines:
      return "lines";
    case Task::kNeedle:
      return "needle";
    case Task::kNiahWord:
      return "niah_word";
    case Task::kNiahNumber:
      return "niah_number";
    case Task::kNiahUuid:
      return "niah_uuid";
    case Task::kNiahMultikey:
      return "niah_multikey";
    case Task::kNiahMultivalue:
      return "niah_multivalue";
    case Task::kVt:
      return "vt";
  }
  return "?";
}

std::optional<Task> TaskByName(std::string_view name) {
  for (Task t : kAllTasks) {
    if (TaskName(t) == name) return t;
  }
  return std::nullopt;
}

bool IsRulerTask(Task t) {
  return t == Task::kNiahWord || t == Task::kNiahNumber || t == Task::kNiahUuid || t == Task::kNiahMultikey ||
         t == Task::kNiahMultivalue || t == Task::kVt;
}

int RulerDefaultGen(Task t) {
  switch (t) {
    case Task::kNiahUuid:         // 36 characters, ~30 tokens with split digits
    case Task::kNiahMultivalue:   // four 7-digit numbers and separators
      return 64;
    case Task::kVt:               // five 5-letter names
      return 48;
    default:
      return 32;
  }
}

Result<std::vector<Task>> ParseTasks(std::string_view list) {
  std::set<Task> chosen;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string_view::npos) end = list.size();
    std::string_view name = list.substr(pos, end - pos);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    pos = end + 1;
    if (name.empty()) continue;
    if (name == "all") {
      chosen.insert(std::begin(kAllTasks), std::end(kAllTasks));
    } else if (name == "niah") {
      chosen.insert({Task::kNiahWord, Task::kNiahNumber, Task::kNiahUuid});
    } else if (name == "ruler") {
      for (Task t : kAllTasks) {
        if (IsRulerTask(t)) chosen.insert(t);
      }
    } else if (std::optional<Task> t = TaskByName(name)) {
      chosen.insert(*t);
    } else {
      return InvalidArgument("unknown task '" + std::string(name) + "'; valid tasks: " + std::string(kValidTasks));
    }
  }
  if (chosen.empty()) return InvalidArgument("no task given; valid tasks: " + std::string(kValidTasks));
  return std::vector<Task>(chosen.begin(), chosen.end());
}

void KvMeasure::Observe(uint64_t bytes, int64_t tokens, uint64_t f16_bytes_per_token,
                        std::optional<double> live) {
  if (bytes > peak_bytes || (bytes == peak_bytes && tokens > peak_tokens)) {
    peak_bytes = bytes;
    peak_tokens = tokens;
    f16_bytes = static_cast<uint64_t>(tokens) * f16_bytes_per_token;
    live_fraction = live;
  }
}

void KvMeasure::Merge(const KvMeasure& o) {
  if (o.peak_bytes > peak_bytes || (o.peak_bytes == peak_bytes && o.peak_tokens > peak_tokens)) *this = o;
}

const std::optional<RetrievalResult>* SpecResult::Retrieval(Task t) const {
  switch (t) {
    case Task::kPasskey:
      return &passkey;
    case Task::kLines:
      return &lines;
    case Task::kNeedle:
      return &needle;
    case Task::kNiahWord:
      return &niah_word;
    case Task::kNiahNumber:
      return &niah_number;
    case Task::kNiahUuid:
      return &niah_uuid;
    case Task::kNiahMultikey:
      return &niah_multikey;
    case Task::kNiahMultivalue:
      return &niah_multivalue;
    case Task::kVt:
      return &vt;
    default:
      return nullptr;
  }
}

std::optional<RetrievalResult>* SpecResult::Retrieval(Task t) {
  return const_cast<std::optional<RetrievalResult>*>(static_cast<const SpecResult*>(this)->Retrieval(t));
}

SolvedCells BaselineSolved(const RetrievalResult& baseline, const RetrievalResult& spec) {
  SolvedCells s;
  for (size_t i = 0; i < baseline.cells.size(); ++i) {
    const CellResult& b = baseline.cells[i];
    if (b.n == 0) continue;
    s.cells++;
    if (b.hits < b.n || i >= spec.cells.size()) continue;
    s.solved++;
    const CellResult& c = spec.cells[i];
    s.n += c.n;
    s.hits += c.hits;
    s.score_sum += c.score_sum;
  }
  return s;
}

PairedComparison CompareWithBaseline(const RetrievalResult& baseline, const RetrievalResult& spec) {
  std::map<int, bool> base_hit;
  for (const PromptOutcome& o : baseline.prompts) base_hit[o.id] = o.hit;
  PairedComparison c;
  for (const PromptOutcome& o : spec.prompts) {
    const auto it = base_hit.find(o.id);
    if (it == base_hit.end()) continue;
    c.n++;
    if (it->second && o.hit) c.both++;
    if (it->second && !o.hit) c.baseline_only++;
    if (!it->second && o.hit) c.spec_only++;
  }
  c.p = McNemarExactP(c.baseline_only, c.spec_only);
  c.verdict = VerdictName(McNemarVerdict(c.baseline_only, c.spec_only));
  return c;
}

Interval ScoreInterval(const RetrievalResult& r, int cell) {
  std::vector<double> scores;
  bool binary = true;
  for (const PromptOutcome& o : r.prompts) {
    if (cell >= 0 && o.cell != cell) continue;
    scores.push_back(o.score);
    binary = binary && (o.score == 0.0 || o.score == 1.0);
  }
  if (scores.empty() || binary) {
    const bool whole = cell < 0 || static_cast<size_t>(cell) >= r.cells.size();
    return whole ? WilsonInterval(r.hits, r.n)
                 : WilsonInterval(r.cells[static_cast<size_t>(cell)].hits, r.cells[static_cast<size_t>(cell)].n);
  }
  return BootstrapMeanInterval(scores);
}

}  // namespace kvx::eval
