# Export recipes (issue 15; include/dcp_export.h): dcp convert --to hf. Part
# of libdcp. The recipes are data, installed under $(pkgdatadir)/recipes.
include_HEADERS += include/dcp_export.h
noinst_HEADERS += src/write/recipe.h
noinst_HEADERS += src/write/hf.h
libdcp_la_SOURCES += src/write/recipe.c src/write/hf_plan.c src/write/hf_view.c src/write/hf_export.c
libdcp_la_CFLAGS += -DDCP_RECIPEDIR='"$(pkgdatadir)/recipes"'
recipesdir = $(pkgdatadir)/recipes
dist_recipes_DATA = \
	recipes/llama-torchtitan.json \
	recipes/llama-megatron.json \
	recipes/qwen2-megatron.json \
	recipes/mixtral-megatron.json \
	recipes/gpt-neox-megatron.json \
	recipes/gpt2-megatron.json \
	recipes/qwen3-torchtitan.json
dist_man_MANS += man/dcp_export_hf.3 man/dcp-recipe.5
