/* placeholder */ typedef int sp_placeholder_k;
