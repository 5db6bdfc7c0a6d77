/* Token ids llama.cpp gives each text, for test data (see make_reference.py).
 *
 * Build (against a llama.cpp build from the llama-cpp-python 0.3.36 sdist):
 *   gcc -O1 -o llama_ids llama_ids.c -I$LLAMA/include -I$LLAMA/ggml/include -L$BUILD/bin -lllama
 * Run: llama_ids MODEL.gguf TEXTS_FILE ADD_SPECIAL(0|1)
 * TEXTS_FILE holds the texts separated by "\n__sep__\n"; one line of ids is printed per text.
 * Special tokens in the text are parsed (llama-tokenize's default).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * data) { (void) level; (void) text; (void) data; }

int main(int argc, char ** argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s MODEL TEXTS ADD_SPECIAL\n", argv[0]); return 2; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], params);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * f = fopen(argv[2], "rb");
    if (!f) { return 1; }
    fseek(f, 0, SEEK_END); long size = ftell(f); fseek(f, 0, SEEK_SET);
    char * all = malloc(size + 1); fread(all, 1, size, f); all[size] = 0; fclose(f);
    const char * sep = "\n__sep__\n";
    char * text = all;
    int add_special = atoi(argv[3]);
    llama_token * ids = malloc(sizeof(llama_token) * (size + 16) * 4);
    for (;;) {
        char * end = strstr(text, sep);
        int len = end ? (int) (end - text) : (int) strlen(text);
        int n = llama_tokenize(vocab, text, len, ids, (size + 16) * 4, add_special, true);
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        if (!end) break;
        text = end + strlen(sep);
    }
    llama_model_free(model);
    return 0;
}
