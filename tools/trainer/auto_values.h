// DeepSpeed's "auto" values, filled from Tessera's own sections as Hugging Face fills them
// from its TrainingArguments.
//
// Note ["auto" values]
// Raw DeepSpeed rejects "auto"; Hugging Face's integration (transformers'
// integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process and
// trainer_config_finalize; accelerate's DeepSpeedPlugin for the rest) replaces each one
// before DeepSpeed sees the file. The trainer binary is Tessera's client, so its sections
// play the TrainingArguments' part:
//
//   DeepSpeed key                              filled from (HF's argument)
//   train_micro_batch_size_per_gpu             $.trainer.per_device_train_batch_size
//   gradient_accumulation_steps                $.trainer.gradient_accumulation_steps
//   train_batch_size                           data-parallel ranks x the two above
//   gradient_clipping                          $.trainer.max_grad_norm
//   optimizer.params.{lr, betas, eps,          $.trainer.optimizer.params (the client
//                     weight_decay}            optimizer, DeepSpeed's schema)
//   scheduler.params.warmup_min_lr             0
//   scheduler.params.warmup_max_lr             the optimizer's lr
//   scheduler.params.warmup_num_steps          $.trainer.warmup_steps (a count when >= 1,
//                                              else a fraction of the steps, rounded up)
//   scheduler.params.total_num_steps           $.trainer.steps
//   fp16.enabled, bf16.enabled, amp.enabled    $.trainer.mixed_precision ("no", "fp16",
//                                              "bf16": accelerate's --mixed_precision)
//   zero_optimization.reduce_bucket_size       hidden x hidden (the model's width)
//   zero_optimization.stage3_prefetch_bucket_size        int(0.9 x hidden x hidden)
//   zero_optimization.stage3_param_persistence_threshold 10 x hidden
//   zero_optimization.stage3_gather_16bit_weights_on_model_save   false (accelerate)
//   zero_optimization.offload_{optimizer,param}.device            "none" (accelerate)
//
// As in transformers' fill_match, a concrete value must equal what a key that exists only
// for this gives (per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm,
// trainer.optimizer's params, warmup_steps, mixed_precision): a mismatch is an error. The
// other sources fill "auto" only: in DeepSpeed a schedule may be longer than the run
// ($.trainer.steps) and peak at another lr than the optimizer's, and transformers never
// compares warmup_min_lr and the width-based sizes either. The keys that exist only for
// this also fill their DeepSpeed key when it is absent, so that none is read and then
// ignored: per_device_train_batch_size, gradient_accumulation_steps and max_grad_norm
// create their keys, mixed_precision creates a missing fp16 or bf16 section (accelerate's
// set_mixed_precision), a fp16 or bf16 section without "enabled" gets it, and warmup_steps
// needs a scheduler with warmup_num_steps. A DeepSpeed optimizer section with "auto" params
// is Hugging Face's template and takes them from $.trainer.optimizer, whose type must then
// be the same, and so every other param of the client's (filled where absent, compared
// where given); the resolved file keeps DeepSpeed's section only. Every problem (an "auto" with no
// source, an "auto" under a key no rule fills, a mismatch) is reported in one error.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::train {

// What resolve_auto_values did: one line per value it filled ("$.train_batch_size: \"auto\"
// -> 24 (2 data-parallel ranks x $.trainer.per_device_train_batch_size 4 x
// $.trainer.gradient_accumulation_steps 3)").
struct AutoResolution {
  std::vector<std::string> filled;
};

// Replaces the "auto" values of the run config `doc` (Note ["auto" values]) over
// `world_size` ranks, and fills absent keys from Tessera's sources. `hidden_size` is the
// model's width (0 when the model section cannot say; an "auto" that needs it is then an
// error). Throws one error listing every problem, each on its own line.
AutoResolution resolve_auto_values(nlohmann::json& doc, int64_t world_size, int64_t hidden_size);

}  // namespace tessera::train
