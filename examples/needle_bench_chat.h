/* needle-bench --chat (needle_bench_chat.c). */
#pragma once
#include "needle.h"
/* Prints the chat figures (text, or one JSON line). Returns the exit code. */
int bench_chat(needle_model *model, int runs, int json);
