/* Which format a path names (dcp_format_guess, dcp_format_name; dcp_file.h):
 * by the folder's names or the file's suffix, nothing read. The single-file
 * reader resolves DCP_FORMAT_AUTO with it; dcp convert picks its source and
 * destination formats with it. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp_file.h"

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

dcp_format dcp_format_guess(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (stat(p, &st) == 0)
            return DCP_FORMAT_SAFETENSORS;
        snprintf(p, sizeof p, "%s/.metadata", path);
        if (stat(p, &st) == 0)
            return DCP_FORMAT_DCP;
        /* No index and no .metadata: a folder of *.safetensors files only. */
        DIR *d = opendir(path);
        struct dirent *de;
        int st_files = 0, others = 0;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            if (has_suffix(de->d_name, ".safetensors"))
                st_files++;
            else
                others++;
        }
        if (d)
            closedir(d);
        return st_files && !others ? DCP_FORMAT_SAFETENSORS : DCP_FORMAT_DCP;
    }
    if (has_suffix(path, ".pt") || has_suffix(path, ".pth") || has_suffix(path, ".bin"))
        return DCP_FORMAT_TORCH_SAVE;
    if (has_suffix(path, ".safetensors"))
        return DCP_FORMAT_SAFETENSORS;
    return DCP_FORMAT_DCP;
}

const char *dcp_format_name(dcp_format f)
{
    switch (f) {
    case DCP_FORMAT_DCP: return "dcp";
    case DCP_FORMAT_TORCH_SAVE: return "torch.save";
    case DCP_FORMAT_SAFETENSORS: return "safetensors";
    default: return "auto";
    }
}
