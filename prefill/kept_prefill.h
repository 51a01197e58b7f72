#ifndef HYBRIDSERVE_PREFILL_KEPT_PREFILL_H_
#define HYBRIDSERVE_PREFILL_KEPT_PREFILL_H_

// The local hand-back, beside the remote contract (prefill_client.h) and not
// in it: a prompt prefilled into a sequence of the caller's own engine, which
// the caller keeps (PrefillWorker::PrefillAndKeep, run by decode's local
// prefill on decode's engine). An engine handle means nothing to a prefill
// worker in another process, so no PrefillClient answers with one.

#include "engine/sequence_table.h"
#include "prefill/prefill_client.h"

namespace hybridserve::prefill {

struct KeptPrefill {
  engine::SequenceId seq = 0;  // live at the prompt's end; the caller releases it
  PrefillOutcome outcome;      // nothing crossed a data plane: transfer_bytes 0
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_KEPT_PREFILL_H_
