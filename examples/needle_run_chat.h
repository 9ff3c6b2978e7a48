/* needle-run's tool-calling mode (needle_run_chat.c). */
#pragma once
#include "needle.h"
/* One turn of `query` with the tools of the JSON file `tools_path`, or with the JSON text
 * `tools_text` when that is not NULL (the built-in model's tools); prints the envelope.
 * Returns the exit code. */
int run_chat(needle_model *model, const char *tools_path, const char *tools_text,
             const char *system, int tool_choice, uint32_t max_tokens, const char *query);
