/* needle-run --tools: one tool-calling turn through needle_chat (needle.h only); prints the
 * response envelope (tool-calling.md §7) indented. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "needle.h"
#include "needle_run_chat.h"

/* Reads a whole file into a NUL-terminated heap buffer, or NULL with errno set. A directory
 * opens and then reads as nothing, which the chat reported as "invalid JSON at byte 0": it is
 * refused as EISDIR instead. A pipe is fine (--tools <(...) reads one); a named FIFO is opened
 * without waiting for a writer (fopen blocked until one came: needle-run hung), and one
 * without a writer reads as nothing: ENODATA. */
/* A tools list larger than this is refused while reading (a character device such as /dev/zero
 * would otherwise be read until memory ran out). */
static const size_t kMaxToolsBytes = (size_t)64 << 20;

/* The file's bytes, NUL-terminated, and their count in *len (a NUL inside is kept). */
static char *read_file(const char *path, size_t *len) {
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        close(fd);
        errno = EISDIR;
        return NULL;
    }
    const int fifo = S_ISFIFO(st.st_mode);
    const int fl = fcntl(fd, F_GETFL);
    if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* from here reads wait for data */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        const int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap >= kMaxToolsBytes) { /* /dev/zero or an endless pipe: refused, not read forever */
            free(buf);
            buf = NULL;
            errno = EFBIG;
            break;
        }
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) { free(buf); buf = NULL; break; }
        buf = bigger, cap *= 2;
    }
    if (buf && ferror(f)) { const int e = errno; free(buf); buf = NULL; errno = e ? e : EIO; }
    if (buf) buf[n] = '\0', *len = n;
    else if (!errno) errno = ENOMEM;
    fclose(f);
    if (buf && n == 0 && fifo) { free(buf); buf = NULL; errno = ENODATA; }
    return buf;
}

/* Prints compact JSON with two-space indentation; strings are copied untouched. */
static void print_pretty(const char *s) {
    int depth = 0, in_str = 0;
    for (const char *p = s; *p; ++p) {
        const char c = *p;
        if (in_str) {
            putchar(c);
            if (c == '\\' && p[1]) putchar(*++p);
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') { in_str = 1; putchar(c); }
        else if ((c == '{' || c == '[') && (p[1] == '}' || p[1] == ']')) { putchar(c); putchar(*++p); }
        else if (c == '{' || c == '[') { printf("%c\n%*s", c, 2 * ++depth, ""); }
        else if (c == '}' || c == ']') { printf("\n%*s%c", 2 * --depth, "", c); }
        else if (c == ',') { printf(",\n%*s", 2 * depth, ""); }
        else if (c == ':') { printf(": "); }
        else putchar(c);
    }
    putchar('\n');
}

int run_chat(needle_model *model, const char *tools_path, const char *tools_text,
             const char *system, int tool_choice, uint32_t max_tokens, const char *query) {
    errno = 0;
    size_t tools_len = 0;
    char *tools = tools_text ? NULL : read_file(tools_path, &tools_len);
    if (!tools && !tools_text) {
        fprintf(stderr, "needle-run: --tools %s: cannot read it: %s%s\n", tools_path, strerror(errno),
                errno == EISDIR ? " (a JSON file of tool schemas is expected)"
                : errno == ENODATA ? " (a FIFO with no writer)"
                : errno == EFBIG ? " (more than 64 MiB)" : "");
        return 1;
    }
    const char *json = tools_text ? tools_text : tools;
    if (tools && strlen(tools) != tools_len) { /* the library reads a C string: it would stop there */
        fprintf(stderr, "needle-run: --tools %s: a NUL byte at offset %zu (JSON text has none)\n", tools_path,
                strlen(tools));
        free(tools);
        return 1;
    }
    if (tools && !strncmp(tools, "\xEF\xBB\xBF", 3)) json += 3; /* a UTF-8 byte order mark: ignored (RFC 8259 8.1) */
    needle_chat_params cp;
    cp.struct_size = sizeof cp;
    needle_chat_params_init(&cp);
    cp.tool_choice = tool_choice;
    needle_chat *chat = NULL;
    needle_status st = needle_chat_create(model, system, json, &cp, &chat);
    free(tools);
    if (st != NEEDLE_OK) {  /* the cause first: it may be --system's, not the tools' */
        fprintf(stderr, "needle-run: %s (%s; tools: %s)\n", needle_last_error(), needle_status_string(st),
                tools_text ? "built-in" : tools_path);
        return 1;
    }
    size_t cap = 65536, len = 0;
    char *out = malloc(cap);
    st = out ? needle_chat_complete(chat, query, max_tokens, out, cap, &len) : NEEDLE_E_NO_MEMORY;
    if (st == NEEDLE_E_BUFFER_TOO_SMALL) {  /* the turn ran; a long envelope: render the next one bigger */
        fprintf(stderr, "needle-run: envelope of %zu bytes did not fit\n", len);
    }
    int rc = 0;
    if (st == NEEDLE_OK) {
        print_pretty(out);
        /* A turn that failed (success:false: truncated, schema_violation, ...) still prints its
         * envelope, but exits 1 like a failed generation, so `needle-run ... && act` is safe. */
        if (strstr(out, "\"success\":false")) rc = 1;
        /* The library's message says "call reset" (a conversation's remedy), which one turn here
         * cannot use. When the model itself wrote until the context was full (not a query too
         * long to start), say so: the query does not suit the model. */
        needle_chat_stats cs;
        cs.struct_size = sizeof cs;
        if (strstr(out, "\"error_code\":\"context_full\"") && needle_chat_last_stats(chat, &cs) == NEEDLE_OK &&
            cs.generated_tokens > 0)
            fprintf(stderr, "needle-run: the model wrote %u tokens without closing its call and filled the "
                            "context (max_seq_len); rephrase the query (--max-tokens N stops such a turn sooner)\n",
                    cs.generated_tokens);
    } else {
        fprintf(stderr, "needle-run: complete: %s (%s)\n", needle_last_error(), needle_status_string(st));
        rc = 1;
    }
    free(out);
    needle_chat_free(chat);
    return rc;
}
